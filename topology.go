package jetflow

import "github.com/jetflow/jetflow/jetflowtype"

// Topology is the deployment setting of the engine's streams and buckets
// (replicas, the broker's duplicate window, retention). Every process of a
// deployment must use the same value: workers provision with it (create or
// update), clients only create what is missing. Zero fields take the
// defaults; an invalid value makes NewClient and Worker.Start fail with an
// error that names the field. See jetflowtype.Topology for its fields.
type Topology = jetflowtype.Topology

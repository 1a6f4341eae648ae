// Package ordertests is how a team that uses jetflow tests its own
// workflows, in its own module: it imports only jetflow's public packages
// (jetflow, jetflowtest and the example order workflow) and proves with
// jetflowtest that an order is charged once through worker crashes, that
// a stubbed payment failure fails the order before shipping, that the
// carrier wait times out when the test advances time, and that a changed
// workflow still replays a recorded order's history.
//
// Run its tests from this directory:
//
//	go test ./...
package ordertests

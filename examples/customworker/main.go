// Command customworker is a team's own jetflow worker: its workflows, and
// everything else — flags, JETFLOW_* environment, config file, NATS
// authentication and TLS, an embedded NATS server when no --nats-url is
// given, /metrics /healthz /readyz, drain on SIGTERM — from workermain.
//
//	go build -o customworker . && ./customworker --help
package main

import (
	"log"
	"os"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/workermain"
)

func main() {
	ws := jetflow.NewRegistry()
	if err := ws.Register(NewWelcomeWorkflow(NewOutbox())); err != nil {
		log.Fatal(err)
	}
	os.Exit(workermain.Main(ws,
		workermain.WithName("customworker"),
		workermain.WithDescription("Runs the welcome workflow: a new user's profile, welcome email and record of it."),
	))
}

// Command openapi-check checks HTTP exchanges against an OpenAPI document
// with kin-openapi (package contract): openapi-check <openapi.yaml> reads
// one exchange a line on its standard input and writes one verdict a line
// on its standard output (contract.Serve), until its input ends. The tests
// of internal/server/httpapi run it.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/jetflow/jetflow/checks/contract"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: openapi-check <openapi.yaml>")
		os.Exit(2)
	}
	c, err := load(os.Args[1])
	if err != nil {
		_ = json.NewEncoder(os.Stdout).Encode(contract.Verdict{Error: err.Error()})
		os.Exit(1)
	}
	if err := c.Serve(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "openapi-check:", err)
		os.Exit(1)
	}
}

func load(path string) (*contract.Contract, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return contract.New(data)
}

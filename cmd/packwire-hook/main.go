// Command packwire-hook is the reference-transaction hook of pushes on a
// packwire cluster's primary, and nothing else: it hands each transaction
// to the packwire server that started the push and waits for its verdict
// (package hookwire). Installed next to the packwire binary, the server
// uses it instead of starting packwire itself as the hook, twice per push:
// it starts in about a millisecond, packwire in several.
package main

import (
	"os"

	"packwire/internal/server/cluster/hookwire"
)

func main() {
	os.Exit(hookwire.Run(os.Args[1:], os.Stdin, os.Stderr))
}

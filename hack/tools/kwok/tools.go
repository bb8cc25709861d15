//go:build tools

// Package tools records the kwok binary built from this module so `go mod
// tidy` keeps its dependencies.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"

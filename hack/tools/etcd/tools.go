//go:build tools

// Package tools records etcdutl (snapshot restore, for the restore test) so
// `go mod tidy` keeps its dependencies.
package tools

import _ "go.etcd.io/etcd/etcdutl/v3"

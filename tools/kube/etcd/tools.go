//go:build tools

// Package tools records the command this module builds (etcd's main package is the
// root of its server module), so that go mod tidy keeps its dependencies.
package tools

import _ "go.etcd.io/etcd/server/v3"

//go:build tools

// Package tools records the command this module builds, so that go mod tidy keeps its
// dependencies; the build tag keeps it out of every ordinary build.
package tools

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
)

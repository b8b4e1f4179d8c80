//go:build tools

// Package tools records the commands this module builds, so that go mod tidy keeps
// their dependencies; the build tag keeps it out of every ordinary build.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)

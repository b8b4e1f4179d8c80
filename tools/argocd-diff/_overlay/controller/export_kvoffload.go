// Added to Argo CD's controller package at build time (go build -overlay, see ../../build.sh); the
// go tool skips this folder otherwise (its name starts with "_"). It changes nothing in Argo CD: it
// only exports normalizeTargetResources (controller/sync.go), the step SyncAppState runs when a sync
// has RespectIgnoreDifferences=true, which puts the live values of the ignored fields into the
// manifests the sync then applies.

package controller

import (
	"github.com/argoproj/gitops-engine/pkg/sync"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	argodiff "github.com/argoproj/argo-cd/v3/util/argo/diff"
)

// KVOffloadRespectIgnoreDifferences is normalizeTargetResources over one comparison's live and target objects.
func KVOffloadRespectIgnoreDifferences(lives, targets []*unstructured.Unstructured, diffConfig argodiff.DiffConfig) ([]*unstructured.Unstructured, error) {
	return normalizeTargetResources(&comparisonResult{
		reconciliationResult: sync.ReconciliationResult{Live: lives, Target: targets},
		diffConfig:           diffConfig,
	})
}

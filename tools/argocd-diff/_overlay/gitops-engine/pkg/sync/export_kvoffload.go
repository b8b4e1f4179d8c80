// Added to gitops-engine's sync package at build time (see ../../../../build.sh). It changes nothing in
// gitops-engine: it only exports pruneObject (pkg/sync/sync_context.go), which a sync with pruning on runs
// for every managed live object no longer rendered from Git. With dryRun true it returns before it reads
// any field of the sync context or deletes anything, so a zero syncContext gives the real verdict.

package sync

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/argoproj/gitops-engine/pkg/sync/common"
)

// KVOffloadPruneObject is (*syncContext).pruneObject(liveObj, prune, dryRun=true): Pruned, or PruneSkipped
// with the reason Argo CD shows in the sync result.
func KVOffloadPruneObject(liveObj *unstructured.Unstructured, prune bool) (common.ResultCode, string) {
	return (&syncContext{}).pruneObject(liveObj, prune, true)
}

// The "deletion" subcommand: which live objects Argo CD deletes when an Application is deleted with
// cascade (the resources-finalizer), and which a sync with pruning on deletes once Git stops rendering
// them. Every verdict is Argo CD's code, called as the controller calls it:
//
//   - Managed: the objects finalizeApplicationDeletion gets from getPermittedAppLiveObjects. That is
//     liveStateCache.GetManagedLiveObjs (controller/cache/cache.go): a top-level live object (no owner
//     references; gitops-engine's clusterCache.GetManagedLiveObjs) whose argo.ResourceTracking.GetAppName
//     is app.InstanceName(the controller's namespace); then AppProject.IsLiveResourcePermitted.
//   - Synced objects get their tracking metadata from argo.NewResourceTracking().SetAppInstance, as the
//     controller's CompareAppState puts it on the manifests a sync applies.
//   - Deleted with the Application: app.CascadedDeletion(), then (*ApplicationController).shouldBeDeleted
//     (exported by _overlay/controller/export_kvoffload_deletion.go); the order, one sync wave per
//     controller pass, from controller.FilterObjectsForDeletion.
//   - Pruned when Git no longer renders it: gitops-engine's (*syncContext).pruneObject with dryRun (exported
//     by _overlay/gitops-engine/pkg/sync/export_kvoffload.go), with prune on, as automated.prune syncs.
//
// Input on stdin, one JSON object:
//
//	{"application": {...},  the Application (its finalizers decide cascade)
//	 "project": {...},      its AppProject (optional; none means the default project Argo CD's server creates)
//	 "synced": [...],       objects the Application synced from Git (they get its tracking metadata)
//	 "live": [...],         other live objects, with the metadata they carry (e.g. applied with kubectl)
//	 "rendered": [...],     optional: what Git renders now; a managed object missing from it is a prune candidate
//	 "argocdCM": {...}}     argocd-cm's data (optional)
//
// Output on stdout: {"cascade": bool, "resources": [...]}, one entry per synced and live object, in that
// order, with "managed", "deletedWithApplication", "deletionWave" (the controller pass that deletes it,
// from 1; 0 if never) and, when rendered was given, "pruned" and "pruneMessage" for each prune candidate.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/controller"
	"github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/argo"
	"github.com/argoproj/argo-cd/v3/util/settings"
	"github.com/argoproj/gitops-engine/pkg/sync"
	synccommon "github.com/argoproj/gitops-engine/pkg/sync/common"
	"github.com/argoproj/gitops-engine/pkg/utils/kube"
)

type deletionInput struct {
	Application *v1alpha1.Application `json:"application"`
	Project     *v1alpha1.AppProject  `json:"project"`
	Synced      []map[string]any      `json:"synced"`
	Live        []map[string]any      `json:"live"`
	Rendered    []map[string]any      `json:"rendered"`
	ArgoCDCM    map[string]string     `json:"argocdCM"`
}

type deletionVerdict struct {
	APIVersion             string `json:"apiVersion"`
	Kind                   string `json:"kind"`
	Namespace              string `json:"namespace,omitempty"`
	Name                   string `json:"name"`
	Managed                bool   `json:"managed"`
	DeletedWithApplication bool   `json:"deletedWithApplication"`
	DeletionWave           int    `json:"deletionWave"`
	Pruned                 *bool  `json:"pruned,omitempty"`
	PruneMessage           string `json:"pruneMessage,omitempty"`
}

type deletionOutput struct {
	Cascade   bool              `json:"cascade"`
	Resources []deletionVerdict `json:"resources"`
}

// defaultProject is the AppProject "default" as Argo CD's API server creates it (initializeDefaultProject).
func defaultProject() *v1alpha1.AppProject {
	return &v1alpha1.AppProject{
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.DefaultAppProjectName},
		Spec: v1alpha1.AppProjectSpec{
			SourceRepos:              []string{"*"},
			Destinations:             []v1alpha1.ApplicationDestination{{Server: "*", Namespace: "*"}},
			ClusterResourceWhitelist: []metav1.GroupKind{{Group: "*", Kind: "*"}},
		},
	}
}

func runDeletion(in io.Reader, out io.Writer) error {
	var req deletionInput
	dec := json.NewDecoder(in)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	app := req.Application
	if app == nil {
		return fmt.Errorf("the request needs an application")
	}
	proj := req.Project
	if proj == nil {
		proj = defaultProject()
	}

	const namespace = "argocd"
	partOf := map[string]string{"app.kubernetes.io/part-of": "argocd"}
	clientset := fake.NewClientset(
		&corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: common.ArgoCDConfigMapName, Namespace: namespace, Labels: partOf},
			Data:       req.ArgoCDCM,
		},
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: common.ArgoCDSecretName, Namespace: namespace, Labels: partOf},
			Data:       map[string][]byte{},
		},
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgr := settings.NewSettingsManager(ctx, clientset, namespace)
	appLabelKey, err := mgr.GetAppInstanceLabelKey()
	if err != nil {
		return fmt.Errorf("instance label key: %w", err)
	}
	trackingMethod, err := mgr.GetTrackingMethod()
	if err != nil {
		return fmt.Errorf("tracking method: %w", err)
	}
	installationID, err := mgr.GetInstallationID()
	if err != nil {
		return fmt.Errorf("installation ID: %w", err)
	}
	tracking := argo.NewResourceTracking()

	objs := make([]*unstructured.Unstructured, 0, len(req.Synced)+len(req.Live))
	for _, o := range req.Synced {
		obj := &unstructured.Unstructured{Object: o}
		err := tracking.SetAppInstance(obj, appLabelKey, app.InstanceName(namespace), app.Spec.Destination.Namespace,
			v1alpha1.TrackingMethod(trackingMethod), installationID)
		if err != nil {
			return fmt.Errorf("tracking %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
		objs = append(objs, obj)
	}
	for _, o := range req.Live {
		objs = append(objs, &unstructured.Unstructured{Object: o})
	}

	// getPermittedAppLiveObjects: managed by this Application, and permitted in its project.
	destCluster := &v1alpha1.Cluster{Server: app.Spec.Destination.Server, Name: app.Spec.Destination.Name}
	noClusters := func(string) ([]*v1alpha1.Cluster, error) { return nil, nil }
	managed := make([]bool, len(objs))
	for i, obj := range objs {
		appName := tracking.GetAppName(obj, appLabelKey, v1alpha1.TrackingMethod(trackingMethod), installationID)
		if appName != app.InstanceName(namespace) || len(obj.GetOwnerReferences()) > 0 {
			continue
		}
		permitted, err := proj.IsLiveResourcePermitted(obj, destCluster, noClusters)
		if err != nil {
			return fmt.Errorf("project %s, %s %s: %w", proj.Name, obj.GetKind(), obj.GetName(), err)
		}
		managed[i] = permitted
	}

	res := deletionOutput{Cascade: app.CascadedDeletion(), Resources: make([]deletionVerdict, len(objs))}
	doomed := []*unstructured.Unstructured{}
	for i, obj := range objs {
		v := deletionVerdict{
			APIVersion: obj.GetAPIVersion(), Kind: obj.GetKind(), Namespace: obj.GetNamespace(), Name: obj.GetName(),
			Managed: managed[i],
		}
		if res.Cascade && managed[i] && controller.KVOffloadShouldBeDeleted(app, obj) {
			v.DeletedWithApplication = true
			doomed = append(doomed, obj)
		}
		res.Resources[i] = v
	}
	// finalizeApplicationDeletion deletes one sync wave per pass (the highest first) and waits for it.
	waves := map[kube.ResourceKey]int{}
	for pass := 1; len(doomed) > 0; pass++ {
		for _, obj := range controller.FilterObjectsForDeletion(doomed) {
			waves[kube.GetResourceKey(obj)] = pass
		}
		rest := []*unstructured.Unstructured{}
		for _, obj := range doomed {
			if waves[kube.GetResourceKey(obj)] == 0 {
				rest = append(rest, obj)
			}
		}
		doomed = rest
	}
	for i, obj := range objs {
		res.Resources[i].DeletionWave = waves[kube.GetResourceKey(obj)]
	}

	if req.Rendered != nil {
		rendered := map[kube.ResourceKey]bool{}
		for _, o := range req.Rendered {
			rendered[kube.GetResourceKey(&unstructured.Unstructured{Object: o})] = true
		}
		for i, obj := range objs {
			if !managed[i] || rendered[kube.GetResourceKey(obj)] {
				continue
			}
			code, message := sync.KVOffloadPruneObject(obj, true)
			pruned := code == synccommon.ResultCodePruned
			res.Resources[i].Pruned = &pruned
			res.Resources[i].PruneMessage = message
		}
	}

	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

// Added to Argo CD's controller package at build time (see ../../build.sh), like export_kvoffload.go. It
// changes nothing in Argo CD: it only exports shouldBeDeleted (controller/appcontroller.go), the test
// finalizeApplicationDeletion puts every managed live object of a cascade-deleted Application through.
// shouldBeDeleted reads none of the controller's fields, so a zero ApplicationController calls it as the
// running controller does.

package controller

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	appv1 "github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
)

// KVOffloadShouldBeDeleted is (*ApplicationController).shouldBeDeleted: whether deleting app with cascade
// deletes obj (not a CRD, not the Application itself, no Delete=false sync option, no Helm keep policy).
func KVOffloadShouldBeDeleted(app *appv1.Application, obj *unstructured.Unstructured) bool {
	return (&ApplicationController{}).shouldBeDeleted(app, obj)
}

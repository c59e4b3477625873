package ctrlutil

import (
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	ctrl "sigs.k8s.io/controller-runtime"
)

// ConflictRetry is when an object is looked at again after a write lost
// a race (the watch usually brings it back sooner).
const ConflictRetry = 100 * time.Millisecond

// RequeueOnConflict turns a lost optimistic-concurrency race into a quiet
// retry and anything else into an error.
func RequeueOnConflict(err error, format string, args ...any) (ctrl.Result, error) {
	if apierrors.IsConflict(err) {
		return ctrl.Result{RequeueAfter: ConflictRetry}, nil
	}
	return ctrl.Result{}, fmt.Errorf(format+": %w", append(args, err)...)
}

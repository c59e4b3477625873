package deploy

import (
	"fmt"
	"os/exec"
	"strings"
)

func kubectlOutput(kubectl string, args ...string) (string, error) {
	out, err := exec.Command(kubectl, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

package kurma

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"strings"
	"text/template"

	"github.com/skeinnet/skein/internal/cni"
)

// maxIfName is IFNAMSIZ less the terminating NUL.
const maxIfName = 15

// templateData is what a containerInterface template sees; the functions
// read it through closures (parseTemplate binds placeholders, render the
// real values).
type templateData struct {
	UUID string
	Num  int
}

func templateFuncs(d *templateData) template.FuncMap {
	return template.FuncMap{
		// uuid is the container's UUID.
		"uuid": func() string { return d.UUID },
		// shortuuid is its first 8 characters (Kurma's meaning).
		"shortuuid": func() string {
			s := strings.ReplaceAll(d.UUID, "-", "")
			return s[:min(8, len(s))]
		},
		// num is how many networks the pod has already (attached before
		// this one, this call's earlier ones included).
		"num": func() int { return d.Num },
		// random N is N random lowercase hex characters (1..15).
		"random": func(n int) (string, error) {
			if n < 1 || n > maxIfName {
				return "", fmt.Errorf("random %d: want 1..%d", n, maxIfName)
			}
			b := make([]byte, (n+1)/2)
			_, _ = rand.Read(b)
			return fmt.Sprintf("%x", b)[:n], nil
		},
	}
}

// parseTemplate parses a containerInterface template and renders it once
// with sample values, so a bad template fails at config time.
func parseTemplate(s string) (*template.Template, error) {
	if s == "" {
		return nil, nil
	}
	d := &templateData{UUID: "146d7cef-fbf6-41da-a2f8-eba218597f9c"}
	t, err := template.New("containerInterface").Option("missingkey=error").Funcs(templateFuncs(d)).Parse(s)
	if err != nil {
		return nil, fmt.Errorf("template %q: %w", s, err)
	}
	if _, err := execTemplate(t, d); err != nil {
		return nil, fmt.Errorf("template %q: %w", s, err)
	}
	return t, nil
}

func execTemplate(t *template.Template, d *templateData) (string, error) {
	var b bytes.Buffer
	if err := t.Funcs(templateFuncs(d)).Execute(&b, d); err != nil {
		return "", err
	}
	name := b.String()
	if err := cni.ValidateIfName(name); err != nil {
		return "", err
	}
	return name, nil
}

// renderAttempts bounds retries of a template that collides (only
// templates using random can come out differently).
const renderAttempts = 16

// RenderIfName renders tmpl for a pod: uuid is the container UUID, num the
// networks it has already; taken holds the names in use (the pod netns's
// links and the names given earlier in the same call). A collision is
// retried when the template draws random characters, else an error.
func RenderIfName(tmpl, uuid string, num int, taken map[string]bool) (string, error) {
	t, err := parseTemplate(tmpl)
	if err != nil {
		return "", err
	}
	if t == nil {
		return "", nil
	}
	random := strings.Contains(tmpl, "random")
	d := &templateData{UUID: uuid, Num: num}
	for range renderAttempts {
		name, err := execTemplate(t, d)
		if err != nil {
			return "", fmt.Errorf("template %q: %w", tmpl, err)
		}
		if !taken[name] {
			return name, nil
		}
		if !random {
			return "", fmt.Errorf("interface %q (from template %q) already exists in the pod", name, tmpl)
		}
	}
	return "", fmt.Errorf("template %q: no free name after %d attempts", tmpl, renderAttempts)
}

// main_test.go - the Go webhook's answers, and its cost per review in process.
//
//	go test                                  # the answers
//	go test -run x -bench . -benchmem        # time per review, the handler alone (no TLS)
//
// The benchmark reviews tests/data/reviews/bench-pod.json (the pod bench_server.py derives its
// bodies from), or the files named in $REVIEWS (separated by spaces: bench_server.py --keep-tmp
// leaves its four bodies in its temporary directory's bodies/), each through /mutate.
package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func post(h http.HandlerFunc, body []byte) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/mutate", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h(w, r)
	return w
}

func TestHandle(t *testing.T) {
	const head = `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1",`
	cases := []struct {
		name   string
		mutate bool
		body   string
		status int
		patch  string // the JSON Patch expected, "" for none
	}{
		{"annotations there", true, head + `"object":{"metadata":{"annotations":{"a":"b"}}}}}`,
			200, `[{"op":"add","path":"/metadata/annotations/gowebhook.test~1seen","value":"true"}]`},
		{"no annotations", true, head + `"object":{"metadata":{"name":"p"}}}}`,
			200, `[{"op":"add","path":"/metadata/annotations","value":{"gowebhook.test/seen":"true"}}]`},
		{"validate", false, head + `"object":{"metadata":{}}}}`, 200, ""},
		{"no uid", true, `{"request":{"object":{}}}`, 400, ""},
		{"not JSON", true, `{"request":`, 400, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := post(handle(c.mutate), []byte(c.body))
			if w.Code != c.status {
				t.Fatalf("status %d, want %d: %s", w.Code, c.status, w.Body)
			}
			if c.status != 200 {
				return
			}
			var review admissionReview
			if err := json.Unmarshal(w.Body.Bytes(), &review); err != nil {
				t.Fatal(err)
			}
			resp := review.Response
			if resp == nil || resp.UID != "u1" || !resp.Allowed {
				t.Fatalf("answer %s", w.Body)
			}
			if string(resp.Patch) != c.patch {
				t.Fatalf("patch %s, want %s", resp.Patch, c.patch)
			}
			// The patch travels base64-encoded: a []byte decodes from nothing else.
			if (c.patch != "") != (resp.PatchType == "JSONPatch") {
				t.Fatalf("patchType %q with patch %q: %s", resp.PatchType, c.patch, w.Body)
			}
		})
	}
}

func BenchmarkHandle(b *testing.B) {
	files := strings.Fields(os.Getenv("REVIEWS"))
	if len(files) == 0 {
		files = []string{filepath.Join("..", "..", "data", "reviews", "bench-pod.json")}
	}
	h := handle(true)
	for _, f := range files {
		body, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(filepath.Base(f), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for i := 0; i < b.N; i++ {
				if w := post(h, body); w.Code != http.StatusOK {
					b.Fatalf("%s: %d %s", f, w.Code, w.Body)
				}
			}
		})
	}
}

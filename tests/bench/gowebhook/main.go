// gowebhook - a minimal Kubernetes mutating admission webhook in Go, standard library only.
//
// A reference for tests/bench/bench_server.py, which runs it beside `gpuguard serve` and nginx
// (same certificate, same wrk load, interleaved rounds): what a webhook written the usual way
// costs per request. It does the core of what a controller-runtime webhook does, without the
// framework: HTTPS with net/http and crypto/tls, the AdmissionReview decoded with encoding/json
// into structs (the pod's metadata and its containers' resources; the rest of the object is
// scanned and skipped), and an answer for the request's uid, allowed, with a JSON Patch that
// adds one annotation. No policy, no logging per request, no metrics: a floor to compare with,
// not a webhook to deploy.
//
//	gowebhook --listen 127.0.0.1:0 --tls-cert tls.crt --tls-key tls.key
//
// It prints "gowebhook: serving on ADDR" on stdout once the socket listens (with port 0, ADDR
// holds the port the kernel chose) and exits 0 on SIGTERM or SIGINT.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// The annotation the mutation adds.
const (
	annotationKey   = "gowebhook.test/seen"
	annotationValue = "true"
	maxBody         = 3 << 20 // bytes; the API server sends at most some 3 MB
)

// admissionReview is admission.k8s.io/v1 AdmissionReview: a request in, a response out.
type admissionReview struct {
	APIVersion string             `json:"apiVersion"`
	Kind       string             `json:"kind"`
	Request    *admissionRequest  `json:"request,omitempty"`
	Response   *admissionResponse `json:"response,omitempty"`
}

type groupVersionKind struct {
	Group   string `json:"group"`
	Version string `json:"version"`
	Kind    string `json:"kind"`
}

type admissionRequest struct {
	UID       string           `json:"uid"`
	Kind      groupVersionKind `json:"kind"`
	Namespace string           `json:"namespace"`
	Operation string           `json:"operation"`
	Object    json.RawMessage  `json:"object"`
}

type status struct {
	Code    int    `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

type admissionResponse struct {
	UID       string  `json:"uid"`
	Allowed   bool    `json:"allowed"`
	Status    *status `json:"status,omitempty"`
	PatchType string  `json:"patchType,omitempty"`
	Patch     []byte  `json:"patch,omitempty"` // encoding/json writes []byte as base64
}

// pod is the part of a core/v1 Pod a GPU webhook looks at; encoding/json skips the rest.
type pod struct {
	Metadata struct {
		Name         string            `json:"name"`
		GenerateName string            `json:"generateName"`
		Namespace    string            `json:"namespace"`
		Labels       map[string]string `json:"labels"`
		Annotations  map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		Containers []container `json:"containers"`
	} `json:"spec"`
}

type container struct {
	Name      string `json:"name"`
	Image     string `json:"image"`
	Resources struct {
		Requests map[string]string `json:"requests"`
		Limits   map[string]string `json:"limits"`
	} `json:"resources"`
}

type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// annotationPath points at the annotation (RFC 6901: "~" is "~0", "/" is "~1" in a token).
var annotationPath = "/metadata/annotations/" +
	strings.NewReplacer("~", "~0", "/", "~1").Replace(annotationKey)

// annotate returns the JSON Patch that adds the annotation to p.
func annotate(p *pod) ([]byte, error) {
	var ops []patchOp
	if p.Metadata.Annotations == nil {
		ops = []patchOp{{Op: "add", Path: "/metadata/annotations",
			Value: map[string]string{annotationKey: annotationValue}}}
	} else {
		ops = []patchOp{{Op: "add", Path: annotationPath, Value: annotationValue}}
	}
	return json.Marshal(ops)
}

// decode reads the request's AdmissionReview; an error is the client's (HTTP 400).
func decode(w http.ResponseWriter, r *http.Request) (*admissionReview, error) {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return nil, fmt.Errorf("content type %q, not application/json", ct)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		return nil, err
	}
	var review admissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		return nil, err
	}
	if review.Request == nil || review.Request.UID == "" {
		return nil, errors.New("no request or no uid in the AdmissionReview")
	}
	return &review, nil
}

// reply writes the AdmissionReview with resp as its response.
func reply(w http.ResponseWriter, review *admissionReview, resp *admissionResponse) {
	out, err := json.Marshal(admissionReview{APIVersion: review.APIVersion, Kind: review.Kind,
		Response: resp})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(out)))
	w.Write(out)
}

// handle serves /mutate (mutate true) or /validate: the review decoded, the pod decoded, and
// an allowing answer, with the annotation's patch for /mutate.
func handle(mutate bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		review, err := decode(w, r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp := &admissionResponse{UID: review.Request.UID, Allowed: true}
		var p pod
		if err := json.Unmarshal(review.Request.Object, &p); err != nil {
			// Answered, not failed: the API server shows the message to the user.
			resp.Allowed = false
			resp.Status = &status{Code: http.StatusBadRequest, Message: "object: " + err.Error()}
		} else if mutate {
			if resp.Patch, err = annotate(&p); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			resp.PatchType = "JSONPatch"
		}
		reply(w, review, resp)
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8443", "address to serve HTTPS on (port 0: any)")
	certFile := flag.String("tls-cert", "tls.crt", "PEM certificate (and chain)")
	keyFile := flag.String("tls-key", "tls.key", "PEM private key")
	flag.Parse()

	mux := http.NewServeMux()
	mux.HandleFunc("POST /mutate", handle(true))
	mux.HandleFunc("POST /validate", handle(false))
	srv := &http.Server{
		Handler:           mux,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gowebhook: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("gowebhook: serving on %s\n", ln.Addr())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	// ServeTLS loads the pair once; a bad file ends it at once with the error.
	if err := srv.ServeTLS(ln, *certFile, *keyFile); !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(os.Stderr, "gowebhook: %v\n", err)
		os.Exit(1)
	}
}

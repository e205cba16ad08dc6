{{- /*
Named templates shared by the chart's manifests: labels and the webhooks' TLS fields.  Resource
names are fixed (gpuguard, gpuguard-config, gpuguard-tls): the server's flags, the certificate's
names and the tests name them, so one release per namespace, and one per cluster (the webhook
configurations and the ClusterRole are cluster-wide).
*/ -}}

{{- /* Helm's standard labels, on every object the chart renders. */ -}}
{{- define "gpuguard.labels" -}}
app.kubernetes.io/name: gpuguard
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuguard
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- /*
The pods' selector: no release or version in it, as a Deployment's selector cannot change
after creation and the Service, PodDisruptionBudget, NetworkPolicy and tests select the same.
*/ -}}
{{- define "gpuguard.selectorLabels" -}}
app.kubernetes.io/name: gpuguard
app.kubernetes.io/component: webhook
{{- end }}

{{- /*
failurePolicy and clientConfig of one webhook.  Arguments: root (the chart's context), path
(/mutate or /validate), name (the webhook's name), policy (its failurePolicy) and live (self
mode: caBundle by webhook name, from the configurations in the cluster; webhooks.yaml says when
they count).
*/ -}}
{{- define "gpuguard.webhookClient" -}}
{{- $v := .root.Values -}}
{{- $bundle := "" -}}
{{- if eq $v.certs.mode "self" -}}
{{- $bundle = get .live .name | default (get .live "") -}}
{{- else if eq $v.certs.mode "provided" -}}
{{- $bundle = required "certs.caBundle: the base64 of the CA certificate is needed with certs.mode=provided" $v.certs.caBundle -}}
{{- end -}}
failurePolicy: {{ .policy }}
clientConfig:
  service:
    name: gpuguard
    namespace: {{ .root.Release.Namespace }}
    path: {{ .path }}
    port: 443
  {{- with $bundle }}
  caBundle: {{ . }}
  {{- end }}
{{- end }}

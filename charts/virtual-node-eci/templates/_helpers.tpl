{{/*
The daemon's names are fixed (its webhook finds its own pods by app.kubernetes.io/name, the
extender's Service by name), so a cluster has one release, as with ack-virtual-node.
*/}}
{{- define "vne.name" -}}virtual-node-eci{{- end -}}

{{- define "vne.labels" -}}
app.kubernetes.io/name: virtual-node-eci
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "vne.mockLabels" -}}
app.kubernetes.io/name: mock-eci
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "vne.image" -}}
{{- $repository := .Values.virtualNode.image.repository | default .Values.image.repository -}}
{{- $tag := .Values.virtualNode.image.tag | default .Values.image.tag | default .Chart.AppVersion -}}
{{ printf "%s:%s" $repository $tag }}
{{- end -}}

{{- define "vne.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}virtual-node-eci{{- else -}}{{ .Values.serviceAccount.name | default "default" }}{{- end -}}
{{- end -}}

{{- define "vne.credentialsSecret" -}}
{{- .Values.credentials.existingSecret | default .Values.credentials.secretName -}}
{{- end -}}

{{/* Refuses values the daemon cannot honour, naming the value. */}}
{{- define "vne.validate" -}}
{{- if not .Values.env.ALIYUN_CLUSTERID -}}
{{- fail "env.ALIYUN_CLUSTERID is required: the cluster id ECI groups are tagged with (e.g. --set env.ALIYUN_CLUSTERID=c1234…)" -}}
{{- end -}}
{{- if not .Values.mockEci.enabled -}}
{{- if not .Values.env.ECI_VSWITCH -}}
{{- fail "env.ECI_VSWITCH is required with the real ECI: the vSwitch id(s) pods get their IPs from" -}}
{{- end -}}
{{- if not .Values.env.ECI_SECURITY_GROUP -}}
{{- fail "env.ECI_SECURITY_GROUP is required with the real ECI" -}}
{{- end -}}
{{- end -}}
{{- if .Values.env.ECI_VPC -}}
{{- fail "env.ECI_VPC is not used: the VPC follows from env.ECI_VSWITCH; remove it" -}}
{{- end -}}
{{- if .Values.env.ALIYUN_RESOURCEGROUP_ID -}}
{{- fail "env.ALIYUN_RESOURCEGROUP_ID is not supported cluster-wide: use the pod annotation k8s.aliyun.com/eci-resource-group-id or a Selector" -}}
{{- end -}}
{{- if and .Values.env.ECI_ACCESS_KEY (not .Values.env.ECI_SECRET_KEY) -}}
{{- fail "env.ECI_ACCESS_KEY is set without env.ECI_SECRET_KEY" -}}
{{- end -}}
{{- if and .Values.env.ECI_ACCESS_KEY .Values.credentials.ramRole -}}
{{- fail "set either env.ECI_ACCESS_KEY or credentials.ramRole, not both" -}}
{{- end -}}
{{- if not (has .Values.webhook.certificate (list "generated" "certManager" "secret")) -}}
{{- fail "webhook.certificate is one of generated, certManager, secret" -}}
{{- end -}}
{{- if not (has .Values.annotationPolicy (list "restricted" "open")) -}}
{{- fail "annotationPolicy is one of restricted, open" -}}
{{- end -}}
{{- if and (eq .Values.annotationPolicy "open") .Values.annotationPolicyRules -}}
{{- fail "annotationPolicyRules needs annotationPolicy=restricted: an open install has no policy" -}}
{{- end -}}
{{- if not (has .Values.kubelet.certificate (list "csr" "secret")) -}}
{{- fail "kubelet.certificate is one of csr, secret" -}}
{{- end -}}
{{- if and (eq .Values.webhook.certificate "certManager") (not .Values.certManager.issuerRef.name) -}}
{{- fail "webhook.certificate=certManager needs certManager.issuerRef.name" -}}
{{- end -}}
{{- if and (eq .Values.webhook.certificate "secret") (not .Values.webhook.secretName) -}}
{{- fail "webhook.certificate=secret needs webhook.secretName" -}}
{{- end -}}
{{- if and (eq .Values.kubelet.certificate "secret") (not .Values.kubelet.secretName) -}}
{{- fail "kubelet.certificate=secret needs kubelet.secretName" -}}
{{- end -}}
{{- end -}}

{{/* Seconds of a duration written as Ns, Nm or Nh (DRAIN_TIMEOUT's forms in values). */}}
{{- define "vne.seconds" -}}
{{- $d := toString . -}}
{{- if hasSuffix "h" $d -}}{{ mul (trimSuffix "h" $d | int) 3600 }}
{{- else if hasSuffix "m" $d -}}{{ mul (trimSuffix "m" $d | int) 60 }}
{{- else -}}{{ trimSuffix "s" $d | int }}
{{- end -}}
{{- end -}}

{{/*
Kept by `helm uninstall`: the replicas, stopped by the uninstall, drain their nodes (evict the
pods, delete the ECI groups, the Node and its Lease) with this identity and these rights. Deleted
with them, the drain would fail and leave nodes and paid ECI groups behind. docs/install.md says
how to remove them afterwards.
*/}}
{{- define "vne.keep" -}}
helm.sh/resource-policy: keep
{{- end -}}

{{/* NODE_LABELS from a map: key=value pairs, sorted, separated by commas. */}}
{{- define "virtual-node-eci.nodeLabels" -}}
{{- $pairs := list -}}
{{- range $key, $value := . -}}
{{- $pairs = append $pairs (printf "%s=%s" $key (toString $value)) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end }}

{{- define "tensorcast.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tensorcast.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tensorcast.labels" -}}
{{ include "tensorcast.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The control socket's path, inside the pod and on the host alike. */}}
{{- define "tensorcast.socket" -}}
{{ .Values.socketDir }}/tensorcastd.sock
{{- end -}}

{{/* pool.size (a quantity in Mi or Gi) in MiB. */}}
{{- define "tensorcast.poolMi" -}}
{{- $s := toString .Values.pool.size -}}
{{- if regexMatch "^[0-9]+Gi$" $s -}}{{ mul (trimSuffix "Gi" $s | atoi) 1024 }}
{{- else if regexMatch "^[0-9]+Mi$" $s -}}{{ trimSuffix "Mi" $s | atoi }}
{{- else -}}{{ fail (printf "pool.size %q: give it in Mi or Gi (4096Mi, 4Gi)" $s) }}
{{- end -}}
{{- end -}}

{{/* The keys the chart sets from its values; config may not repeat them. */}}
{{- define "tensorcast.ownedKeys" -}}
socket data_dir metrics_address peer_listen peer_advertise daemon_id cluster_key_file directory etcd_endpoints etcd_prefix etcd_ca_file etcd_cert_file etcd_key_file ebpf rdma pool_size
{{- end -}}

{{/* tensorcastd.toml: config with the chart's keys set. */}}
{{- define "tensorcast.config" -}}
{{- $c := deepCopy .Values.config -}}
{{- range $k := splitList " " (include "tensorcast.ownedKeys" .) -}}
{{- if hasKey $c $k -}}{{ fail (printf "config.%s is set by the chart from its values; remove it from config" $k) }}{{- end -}}
{{- end -}}
{{- $_ := set $c "socket" (include "tensorcast.socket" .) -}}
{{- $_ = set $c "data_dir" .Values.dataDir -}}
{{- $_ = set $c "pool_size" (printf "%sMiB" (include "tensorcast.poolMi" .)) -}}
{{- $_ = set $c "metrics_address" (printf "0.0.0.0:%d" (int .Values.metrics.port)) -}}
{{- $_ = set $c "ebpf" (ternary "auto" "off" .Values.ebpf.enabled) -}}
{{- $_ = set $c "rdma" (ternary "auto" "off" (and .Values.rdma.enabled .Values.peers.enabled)) -}}
{{- if not (hasKey $c "allowed_files") -}}{{ $_ = set $c "allowed_files" (list .Values.dataDir) }}{{- end -}}
{{- if not (hasKey $c "tenants") -}}
{{- $_ = set $c "allowed_gids" (append (default (list) $c.allowed_gids) .Values.daemon.gid | uniq) -}}
{{- end -}}
{{- if .Values.peers.enabled -}}
{{- $_ = set $c "peer_listen" (printf "0.0.0.0:%d" (int .Values.peers.port)) -}}
{{- $_ = set $c "cluster_key_file" "/etc/tensorcast/cluster/cluster.key" -}}
{{- end -}}
{{- if .Values.etcd.enabled -}}
{{- if not .Values.peers.enabled -}}{{ fail "etcd.enabled needs peers.enabled (the directory finds peers)" }}{{- end -}}
{{- if not .Values.etcd.endpoints -}}{{ fail "etcd.enabled needs etcd.endpoints" }}{{- end -}}
{{- $_ = set $c "directory" "etcd" -}}
{{- $_ = set $c "etcd_endpoints" .Values.etcd.endpoints -}}
{{- $_ = set $c "etcd_prefix" .Values.etcd.prefix -}}
{{- if .Values.etcd.tlsSecret -}}
{{- $_ = set $c "etcd_ca_file" "/etc/tensorcast/etcd/ca.crt" -}}
{{- $_ = set $c "etcd_cert_file" "/etc/tensorcast/etcd/tls.crt" -}}
{{- $_ = set $c "etcd_key_file" "/etc/tensorcast/etcd/tls.key" -}}
{{- end -}}
{{- end -}}
{{- include "tensorcast.toml" $c -}}
{{- end -}}

{{/* TOML of a flat map: scalars and lists as JSON values (valid TOML for
strings, numbers, booleans and arrays of them), then each list of maps as
an array of tables ([[tenants]], [[peers]]). */}}
{{- define "tensorcast.toml" -}}
{{- range $k, $v := . }}
{{- if not (and (kindIs "slice" $v) $v (kindIs "map" (first $v))) }}
{{ $k }} = {{ $v | toJson }}
{{- end }}
{{- end }}
{{- range $k, $v := . }}
{{- if and (kindIs "slice" $v) $v (kindIs "map" (first $v)) }}
{{- range $v }}

[[{{ $k }}]]
{{- range $kk, $vv := . }}
{{ $kk }} = {{ $vv | toJson }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* drain_timeout (config, else the daemon's 10s) in whole seconds, given
as the chart reads it: hours, minutes and seconds (1m30s, 45s). */}}
{{- define "tensorcast.drainSeconds" -}}
{{- $d := toString (default "10s" .Values.config.drain_timeout) -}}
{{- $re := "^(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?$" -}}
{{- if or (eq $d "") (not (regexMatch $re $d)) -}}
{{- fail (printf "config.drain_timeout %q: give it in h, m and s (30s, 1m30s) so the chart can check terminationGracePeriodSeconds covers it" $d) -}}
{{- end -}}
{{- $h := regexReplaceAll $re $d "${1}" | default "0" | atoi -}}
{{- $m := regexReplaceAll $re $d "${2}" | default "0" | atoi -}}
{{- $s := regexReplaceAll $re $d "${3}" | default "0" | atoi -}}
{{- add (mul $h 3600) (mul $m 60) $s -}}
{{- end -}}

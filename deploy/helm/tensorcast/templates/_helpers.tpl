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

{{/* A size as the daemon reads it (4096, 64k, 64KiB, 256m, 256MiB, 4g, 4GiB,
1t: binary suffixes, any case) in MiB, rounded up. The argument is a list:
the size and the key it is the value of, for the error. */}}
{{- define "tensorcast.sizeMi" -}}
{{- $v := index . 0 -}}
{{- if kindIs "float64" $v }}{{ $v = int64 $v }}{{ end -}}
{{- $s := lower (trim (toString $v)) -}}
{{- $m := regexFindAll "^([0-9]+)\\s*(kib|mib|gib|tib|k|m|g|t|b)?$" $s 1 -}}
{{- if not $m -}}{{ fail (printf "%s %q: not a size the daemon reads (4096, 256MiB, 4GiB)" (index . 1) (toString (index . 0))) }}{{- end -}}
{{- $n := regexReplaceAll "^([0-9]+).*$" $s "${1}" | atoi -}}
{{- $unit := regexReplaceAll "^[0-9]+\\s*" $s "" -}}
{{- $mult := get (dict "" 1 "b" 1 "k" 1024 "kib" 1024 "m" 1048576 "mib" 1048576 "g" 1073741824 "gib" 1073741824 "t" 1099511627776 "tib" 1099511627776) $unit -}}
{{- div (add (mul $n $mult) 1048575) 1048576 -}}
{{- end -}}

{{/* The pools' memory in MiB: pool.size, or with [[tenants]] under config
the sum of the tenants' pools (each its pool_size, else pool.size), as
the daemon makes them. */}}
{{- define "tensorcast.poolsMi" -}}
{{- $default := include "tensorcast.poolMi" . | atoi -}}
{{- $tenants := default (list) .Values.config.tenants -}}
{{- if not $tenants -}}{{ $default }}
{{- else -}}
{{- $total := 0 -}}
{{- range $t := $tenants -}}
{{- if $t.pool_size -}}
{{- $total = add $total (include "tensorcast.sizeMi" (list $t.pool_size (printf "config.tenants %s pool_size" (toString $t.name))) | atoi) -}}
{{- else -}}
{{- $total = add $total $default -}}
{{- end -}}
{{- end -}}
{{- $total -}}
{{- end -}}
{{- end -}}

{{/* The keys the chart sets from its values; config may not repeat them. */}}
{{- define "tensorcast.ownedKeys" -}}
socket data_dir metrics_address peer_listen peer_advertise daemon_id cluster_key_file directory etcd_endpoints etcd_prefix etcd_ca_file etcd_cert_file etcd_key_file ebpf rdma pool_size store_handoff
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
{{- $_ = set $c "store_handoff" (ternary "on" "off" .Values.handoff.enabled) -}}
{{- if not (hasKey $c "allowed_files") -}}{{ $_ = set $c "allowed_files" (list .Values.dataDir) }}{{- end -}}
{{- if not $c.tenants -}}
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

{{/* drain_timeout (config, else the daemon's 10s) in whole seconds,
rounded up: any Go duration the daemon takes (90s, 1m30s, 1500ms, 1.5s,
2h45m), which is a sequence of decimal numbers, each with a unit of ns,
us (or µs), ms, s, m or h. */}}
{{- define "tensorcast.drainSeconds" -}}
{{- $d := toString (default "10s" .Values.config.drain_timeout) -}}
{{- $term := "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)" -}}
{{- if not (regexMatch (printf "^(%s)+$" $term) $d) -}}
{{- fail (printf "config.drain_timeout %q: give it as a Go duration (30s, 1m30s, 1500ms), as the daemon reads it" $d) -}}
{{- end -}}
{{- /* Per unit, a second is how many of it (below a second) or how many
seconds it is: a division by 1000 keeps 3000ms exactly 3. */ -}}
{{- $per := dict "ns" 1000000000 "us" 1000000 "µs" 1000000 "μs" 1000000 "ms" 1000 -}}
{{- $secs := dict "s" 1 "m" 60 "h" 3600 -}}
{{- $total := 0.0 -}}
{{- range $t := regexFindAll $term $d -1 -}}
{{- $u := regexReplaceAll "^[0-9.]+" $t "" -}}
{{- $n := float64 (regexReplaceAll "[^0-9.]+$" $t "") -}}
{{- if hasKey $per $u -}}
{{- $total = addf $total (divf $n (get $per $u)) -}}
{{- else -}}
{{- $total = addf $total (mulf $n (get $secs $u)) -}}
{{- end -}}
{{- end -}}
{{- /* Rounded to the nanosecond first: 1.1m is 66s, not 66.000...1s. */ -}}
{{- round $total 9 | ceil | int -}}
{{- end -}}

{{/* "true" when the pods run in the node's network namespace: peers with
the hand-off's surge, where the new daemon takes the old one's peer
listener over and no host port may be declared (see daemonset.yaml). */}}
{{- define "tensorcast.hostNetwork" -}}
{{- and .Values.peers.enabled .Values.handoff.enabled .Values.handoff.surge | toString -}}
{{- end -}}

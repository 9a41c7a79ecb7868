# scripts/lib/stats.sh - the medians and ratios of the store bench scripts
# (bench-store.sh, bench-store-queue.sh). Source it; median reads the
# benchmark lines the script collected in $out.

median() { # NAME UNIT: the median of the value printed before UNIT on NAME's lines
  awk -v name="$1" -v unit="$2" '
    { n = $1; sub(/-[0-9]+$/, "", n); if (n != name) next
      for (i = 3; i <= NF; i++) if ($i == unit) print $(i-1) }' "$out" | sort -g |
  awk '{ v[NR] = $1 } END { if (NR == 0) { print "nan"; exit }
         print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2 }'
}
med() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }'; }

# SIMULATED (gpuprov lab) stand-in for Node Feature Discovery's master, which no build here provides:
# the labels GPU feature discovery publishes as NodeFeature objects (nfd.k8s-sigs.io/v1alpha1, one per
# node, spec.labels) are put on their node, and the ones no object names any more are taken off again,
# as NFD's master does (it too keeps the names it manages in an annotation). It polls every 10 s where
# the real master watches.
set -u
NOTE=gpuprov-lab/node-feature-labels
while :; do
  if kubectl get nodefeatures -n "$NAMESPACE" \
      -o jsonpath="{range .items[*]}{.metadata.labels['nfd\.node\.kubernetes\.io/node-name']} {.spec.labels}{'\n'}{end}" \
      > /tmp/features; then
    while read -r node json; do
      [ -n "$node" ] || continue
      want=$(echo "$json" | tr -d '{}' | tr ',' '\n' | sed -n 's/^"\([^"]*\)":"\([^"]*\)"$/\1=\2/p' | sort)
      [ "$want" = "$(cat "/tmp/last-$node" 2>/dev/null)" ] && continue
      had=$(kubectl get node "$node" -o jsonpath="{.metadata.annotations['gpuprov-lab/node-feature-labels']}") || continue
      drop=""
      for old in $(echo "$had" | tr ',' ' '); do
        echo "$want" | grep -q "^$old=" || drop="$drop $old-"
      done
      names=$(echo "$want" | sed -n 's/=.*//p' | tr '\n' ',' | sed 's/,$//')
      # shellcheck disable=SC2086
      if [ -n "$want$drop" ] && kubectl label node "$node" --overwrite $want $drop >/dev/null &&
         kubectl annotate node "$node" --overwrite "$NOTE=$names" >/dev/null; then
        echo "$(date -u +%H:%M:%S) node-features (gpuprov lab stand-in): $node: labels from its NodeFeature${drop:+, removed:$drop}"
        echo "$want" > "/tmp/last-$node"
      fi
    done < /tmp/features
  fi
  sleep 10
done

#!/bin/sh
# How a worker in the sample Deployment reads its epoch: the kubelet keeps
# the downward-API files current. Stamp the epoch on every write to a fenced
# object; stop when the state is not Held (the fence refuses stale writes
# anyway).
while true; do
  state="$(cat /etc/fencekeeper/lease-state 2>/dev/null)"
  epoch="$(cat /etc/fencekeeper/epoch 2>/dev/null)"
  if [ "$state" = "Held" ]; then
    kubectl annotate --overwrite configmap report-2026-07 "fencekeeper.io/epoch=$epoch" >/dev/null &&
      kubectl patch configmap report-2026-07 --type merge -p "{\"metadata\":{\"annotations\":{\"fencekeeper.io/epoch\":\"$epoch\"}},\"data\":{\"report.csv\":\"written under epoch $epoch\"}}"
  fi
  sleep 10
done

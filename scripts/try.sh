#!/usr/bin/env bash
# The device loop and the mesh on one machine, with nothing from outside: a
# tiny model served by clawmesh's native engine, a node in front of it that
# made a mesh, a short agent conversation through the node's gateway (a
# correction, the user moving on, explicit feedback), what the pool
# recorded and how the reward plugins scored it, what would leave the
# device (scrubbed), and a trainer peer that joined with an invite token and
# trains it into the mesh's next adapter version, which comes back to the
# node over QUIC and is hot-swapped into the model server.
#
#   scripts/try.sh          # everything in a temporary directory, removed at the end
#   scripts/try.sh --keep   # the directory stays, and the end says where
set -euo pipefail
cd "$(dirname "$0")/.."

keep=
case "${1:-}" in
  --keep) keep=1 ;;
  "") ;;
  -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "scripts/try.sh: unknown argument $1 (--keep leaves the data directory)" >&2; exit 2 ;;
esac

work=$(mktemp -d)
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  if [ -n "$keep" ]; then
    echo
    echo "== kept: $work"
    echo "   the device's pool:  $work/clawmesh pool stats --data $work/data"
    echo "                       $work/clawmesh pool ls --data $work/data"
    echo "                       $work/clawmesh pool show --data $work/data STEP"
    echo "   what would leave:   $work/clawmesh pool preview --data $work/data"
    echo "   the trainer:        $work/clawmesh trainer status --data $work/trainer"
    echo "   remove it with:     rm -rf $work"
  else
    rm -rf "$work"
    echo
    echo "(scripts/try.sh --keep leaves the data directory, to look at the pool with clawmesh pool ls, show, stats)"
  fi
}
trap cleanup EXIT

echo "== building clawmesh"
go build -o "$work/clawmesh" ./cmd/clawmesh
cm="$work/clawmesh"
model_port=${MODEL_PORT:-18401}
gw_port=${GATEWAY_PORT:-18400}

echo "== clawmesh serve --tiny (a tiny random Qwen3-shaped model) on 127.0.0.1:$model_port"
"$cm" serve --tiny --listen "127.0.0.1:$model_port" > "$work/serve.log" 2>&1 &
echo "== clawmesh mesh init: this device makes a mesh"
"$cm" mesh init --name try --data "$work/data"
echo "== clawmesh node on 127.0.0.1:$gw_port, a mesh peer on loopback"
"$cm" node --upstream "http://127.0.0.1:$model_port/v1" --upstream-kind clawmesh \
  --listen "127.0.0.1:$gw_port" --data "$work/data" --share-interval 1s \
  --p2p-listen /ip4/127.0.0.1/udp/0/quic-v1 --p2p-listen /ip4/127.0.0.1/tcp/0 --no-mdns > "$work/node.log" 2>&1 &

for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$gw_port/v1/models" > /dev/null 2>&1 && break
  sleep 0.2
done
curl -sf "http://127.0.0.1:$gw_port/v1/models" > /dev/null || { cat "$work/serve.log" "$work/node.log"; exit 1; }

gw="http://127.0.0.1:$gw_port/v1/chat/completions"
chat() { curl -sf "$gw" -H 'Content-Type: application/json' -H 'X-Session-Id: try' "${@:2}" -d "$1"; }
# say prints a JSON string as the text it holds, indented.
say() { python3 -c 'import sys,json; print("\n".join("   " + l for l in json.loads(sys.argv[1]).splitlines() or [""]))' "$1"; }
# reward prints a recorded step's state and reward, from the pool's export.
reward() {
  "$cm" pool export --data "$work/data" 2>/dev/null | python3 -c '
import sys, json
want = sys.argv[1]
for line in sys.stdin:
    s = json.loads(line)
    if s["id"] != want:
        continue
    r = s.get("reward") or {}
    v = r.get("value")
    print("state %s, reward %s" % (s["state"], "none" if v is None else "%+.2f" % v))
    for sc in r.get("scores") or []:
        val = sc.get("value")
        print("     %-10s %s  %s" % (sc["plugin"], "abstain" if val is None else "%+.2f" % val, sc.get("reason", "")))
' "$1"
}
sys='{"role":"system","content":"You are a helpful assistant."}'
u1='{"role":"user","content":"List the files here, then mail the list to ann.lee@example.org."}'

echo "== turn 1: the agent asks, the model answers (streamed)"
a1=$(chat "{\"model\":\"tiny\",\"stream\":true,\"max_tokens\":24,\"messages\":[$sys,$u1]}" \
  | sed -n 's/^data: //p' | grep -v '^\[DONE\]' \
  | python3 -c 'import sys,json; print(json.dumps("".join((c["choices"][0]["delta"].get("content") or "") for c in map(json.loads, sys.stdin) if c.get("choices"))))')
echo "   reply:"; say "$a1"
echo "== turn 2: the user corrects it; that message becomes turn 1's next state"
a1msg="{\"role\":\"assistant\",\"content\":$a1}"
u2='{"role":"user","content":"No, that is wrong. You should have checked the directory first."}'
a2=$(chat "{\"model\":\"tiny\",\"max_tokens\":16,\"messages\":[$sys,$u1,$a1msg,$u2]}" \
  | python3 -c 'import sys,json; print(json.dumps(json.load(sys.stdin)["choices"][0]["message"]["content"] or ""))')
echo "   reply:"; say "$a2"
echo "== turn 3: the user moves on, and ends the session (X-Session-Done)"
a2msg="{\"role\":\"assistant\",\"content\":$a2}"
u3='{"role":"user","content":"Thanks. Now, what is the capital of France?"}'
a3=$(chat "{\"model\":\"tiny\",\"max_tokens\":16,\"messages\":[$sys,$u1,$a1msg,$u2,$a2msg,$u3]}" -H 'X-Session-Done: true' \
  | python3 -c 'import sys,json; print(json.dumps(json.load(sys.stdin)["choices"][0]["message"]["content"] or ""))')
echo "   reply:"; say "$a3"

echo "== explicit feedback on the session's last step: POST /clawmesh/v1/feedback"
last=$("$cm" pool ls --data "$work/data" | tail -n +2 | tail -1 | awk '{print $1}')
echo "   before it, step $last had: $(reward "$last")"
fb=$(curl -sf "http://127.0.0.1:$gw_port/clawmesh/v1/feedback" -d '{"session_id":"try","score":1,"text":"thanks, that is right"}')
echo "   the feedback went to step $(python3 -c 'import sys,json; print(json.loads(sys.argv[1])["step_id"])' "$fb")"
echo "== waiting for the reward plugins to score the steps (compiled in the background on a first start)"
for _ in $(seq 1 300); do
  "$cm" pool export --data "$work/data" 2>/dev/null | python3 -c '
import sys, json
steps = [json.loads(l) for l in sys.stdin]
fed = [s for s in steps if s["id"] == sys.argv[1] and any(x["plugin"] == "feedback" and x.get("value") is not None for x in (s.get("reward") or {}).get("scores") or [])]
sys.exit(0 if len(steps) >= 3 and all(s.get("reward") for s in steps) and fed else 1)' "$last" && break
  sleep 0.2
done
echo "   with the feedback, step $last has: $(reward "$last")"
echo
"$cm" pool stats --data "$work/data"
echo
"$cm" pool ls --data "$work/data"
for id in $("$cm" pool ls --data "$work/data" | tail -n +2 | awk '{print $1}' | head -2); do
  echo
  "$cm" pool show --data "$work/data" "$id"
done

echo
echo "== a trainer joins: clawmesh invite --role trainer, then clawmesh join"
token=$("$cm" invite --role trainer --data "$work/data" 2>/dev/null)
echo "   token: ${token:0:60}..."
"$cm" join "$token" --data "$work/trainer"
"$cm" trainer --data "$work/trainer" --p2p-listen /ip4/127.0.0.1/tcp/0 --no-mdns > "$work/trainer.log" 2>&1 &
echo
echo "== what leaves this device (clawmesh pool preview, the first step)"
"$cm" pool preview --data "$work/data" --limit 1 > "$work/preview.txt"
head -40 "$work/preview.txt"
echo
echo "== waiting for the trainer to receive the batch"
for _ in $(seq 1 150); do
  n=$( ("$cm" mesh batches --data "$work/trainer" 2>/dev/null || true) | tail -n +2 | wc -l)
  [ "$n" -ge 1 ] && break
  sleep 0.2
done
"$cm" mesh status --data "$work/data"
echo
"$cm" mesh batches --data "$work/data"
echo
"$cm" mesh batches --data "$work/trainer"
id=$("$cm" mesh batches --data "$work/trainer" | tail -n +2 | awk '{print $1}' | head -1)
[ -n "$id" ] || { echo "the trainer received no batch"; cat "$work/node.log" "$work/trainer.log"; exit 1; }
echo
echo "== the batch's first step as the trainer got it (clawmesh mesh batch $id)"
"$cm" mesh batch "$id" --data "$work/trainer" > "$work/batch.jsonl"
head -1 "$work/batch.jsonl" | python3 -c 'import sys,json; s=json.load(sys.stdin); print(json.dumps({k: s[k] for k in ("id","session_id","timings")}, indent=1)); [print("  ", m["role"], ":", (m.get("content") or "")[:120]) for m in s["request"]["messages"]]'

echo "== the trainer, alone in its raft group, trains the batch into adapter v1 (clawmesh trainer status)"
for _ in $(seq 1 240); do
  if "$cm" trainer status --json --data "$work/trainer" 2>/dev/null | python3 -c 'import sys,json; s=json.load(sys.stdin); sys.exit(0 if s["batches"]["trained"] >= 1 else 1)' 2>/dev/null; then
    break
  fi
  sleep 0.25
done
"$cm" trainer status --data "$work/trainer"
"$cm" trainer status --json --data "$work/trainer" | python3 -c 'import sys,json; s=json.load(sys.stdin); sys.exit(0 if s["batches"]["trained"] >= 1 else 1)' \
  || { echo "the trainer trained nothing"; cat "$work/trainer.log"; exit 1; }
ls "$work/trainer/adapters"

echo
echo "== v1 comes back to the device over QUIC, verified, installed and hot-swapped (clawmesh weights ls)"
for _ in $(seq 1 240); do
  if "$cm" weights ls --json --data "$work/data" 2>/dev/null | python3 -c 'import sys,json; s=json.load(sys.stdin); sys.exit(0 if s["serving"] == "v1" else 1)' 2>/dev/null; then
    break
  fi
  sleep 0.25
done
"$cm" weights ls --data "$work/data"
"$cm" weights ls --json --data "$work/data" | python3 -c 'import sys,json; s=json.load(sys.stdin); sys.exit(0 if s["serving"] == "v1" else 1)' \
  || { echo "v1 is not serving on the node"; cat "$work/node.log"; exit 1; }
echo
echo "== the next call is served by v1 (the X-Clawmesh-Adapter header), and recorded as such (clawmesh pool stats)"
curl -s -D - -o /dev/null "$gw" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","max_tokens":8,"messages":[{"role":"user","content":"and now?"}]}' | grep -i '^x-clawmesh-adapter'
sleep 0.5
"$cm" pool stats --data "$work/data" | grep -i 'served by' || true

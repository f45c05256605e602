#!/usr/bin/env bash
# callgraph.sh [--rooms] [--edges] [BUILD_DIR] - which engine file calls which,
# from the built objects (nm: the global symbols each object defines and the
# ones it uses), and the loops in that graph.
#
#   (default)  files: engine/comm/coll.c -> engine/run/run.c when coll.c
#              uses a function or variable that run.c defines
#   --rooms    the same between rooms, a room being the folder directly
#              under engine/ that holds the file (engine/plan holds
#              engine/plan/algos/*; engine/CMakeLists.txt lists the rooms)
#   --edges    print every edge with the symbols behind it, not only loops
#
# A loop is a set of files (rooms) each reachable from every other (a
# strongly connected component of more than one). Prints each with the edges
# inside it. With --rooms, also every call from a room to one listed after
# it in ENGINE_ROOMS (engine/CMakeLists.txt: each room uses only those
# before it). Exits 1 when there is a loop (or such a call), 0 when none,
# 2 when the build is missing. Static functions are not seen (they cannot cross a
# file); calls through function pointers are not either. Build first:
# scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
rooms=0 edges=0 build=build
while [ $# -gt 0 ]; do
  case "$1" in
  --rooms) rooms=1; shift ;;
  --edges) edges=1; shift ;;
  -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "callgraph.sh: unknown option $1" >&2; exit 2 ;;
  *) build=$1; shift ;;
  esac
done
objdir=$build/engine/CMakeFiles/chorus_engine.dir
[ -d "$objdir" ] || { echo "callgraph.sh: $objdir not found (build first: scripts/build.sh)" >&2; exit 2; }

# one line per object and symbol: "D file symbol" (defined) or "U file symbol" (used)
list=$(mktemp)
trap 'rm -f "$list"' EXIT
while IFS= read -r o; do
  f=engine/${o#"$objdir"/}
  f=${f%.o}
  [ -f "$f" ] || continue # left by a build of files since moved or removed
  nm --defined-only -g "$o" | awk -v f="$f" 'NF == 3 { print "D", f, $3 }' >>"$list"
  nm -u "$o" | awk -v f="$f" '{ print "U", f, $NF }' >>"$list"
done < <(find "$objdir" -name '*.c.o' | sort)

order=$(sed -n 's/^set(ENGINE_ROOMS \(.*\))$/\1/p' engine/CMakeLists.txt)
python3 - "$list" "$rooms" "$edges" "$order" <<'EOF'
import collections, os, sys

lst, rooms, show_edges = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
order = ["engine/" + r for r in sys.argv[4].split()]
owner, uses = {}, collections.defaultdict(set)
for line in open(lst):
    kind, f, sym = line.split()
    parts = f.split("/")
    node = ("/".join(parts[:2]) if len(parts) > 2 else parts[0]) if rooms else f
    if kind == "D":
        owner[sym] = node
    else:
        uses[node].add(sym)
nodes = sorted(set(owner.values()) | set(uses))
edge = collections.defaultdict(set)  # (a, b) -> symbols of b that a uses
for a in nodes:
    for s in uses.get(a, ()):
        b = owner.get(s)
        if b and b != a:
            edge[(a, b)].add(s)
succ = collections.defaultdict(list)
for a, b in edge:
    succ[a].append(b)

# Tarjan's strongly connected components, iteratively
index, low, on, stack, sccs, counter = {}, {}, set(), [], [], [0]
for root in nodes:
    if root in index:
        continue
    work = [(root, iter(sorted(succ[root])))]
    index[root] = low[root] = counter[0]; counter[0] += 1
    stack.append(root); on.add(root)
    while work:
        v, it = work[-1]
        for w in it:
            if w not in index:
                index[w] = low[w] = counter[0]; counter[0] += 1
                stack.append(w); on.add(w)
                work.append((w, iter(sorted(succ[w]))))
                break
            if w in on:
                low[v] = min(low[v], index[w])
        else:
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                sccs.append(sorted(comp))

what = "rooms" if rooms else "files"
print(f"{len(nodes)} engine {what}, {len(edge)} edges between them")
if show_edges:
    for (a, b) in sorted(edge):
        syms = sorted(edge[(a, b)])
        more = f" (+{len(syms) - 4})" if len(syms) > 4 else ""
        print(f"  {a} -> {b}: {', '.join(syms[:4])}{more}")
loops = [c for c in sccs if len(c) > 1]
for c in sorted(loops, key=len, reverse=True):
    inside = set(c)
    print(f"loop of {len(c)} {what}: {' '.join(c)}")
    for (a, b) in sorted(edge):
        if a in inside and b in inside:
            syms = sorted(edge[(a, b)])
            more = f" (+{len(syms) - 3})" if len(syms) > 3 else ""
            print(f"    {a} -> {b}: {', '.join(syms[:3])}{more}")
if not loops:
    print(f"no loop between engine {what}")
upward = []
if rooms:
    if not order:
        print("ENGINE_ROOMS not found in engine/CMakeLists.txt")
        sys.exit(2)
    rank = {r: i for i, r in enumerate(order)}
    for (a, b) in sorted(edge):
        if a not in rank or b not in rank:
            upward.append((a, b, "not in ENGINE_ROOMS"))
        elif rank[b] > rank[a]:
            upward.append((a, b, "listed after it"))
    for a, b, why in upward:
        syms = sorted(edge[(a, b)])
        print(f"upward: {a} -> {b} ({why}): {', '.join(syms[:3])}")
    if not upward:
        print("each room calls only rooms before it in ENGINE_ROOMS: " + " ".join(order))
sys.exit(1 if loops or upward else 0)
EOF

#!/usr/bin/env bash
# Builds the English training text of the committed tiny model (models/deepinfer-tiny-v3) from Debian packages.
#
#   tools/prepare_train_data.sh OUT_DIR
#
# Installs (apt-get, Debian 12 "bookworm" versions used for the committed model in brackets):
#   fortunes [1:1.99.1-7.3], fortunes-min [1:1.99.1-7.3]   /usr/share/games/fortunes/* (not *.dat, *.u8)
#   python3.11-doc [3.11.2-6+deb12u*]                      /usr/share/doc/python3.11/html/_sources/**/*.rst.txt
#   perl-doc [5.36.0-7+deb12u*]                            /usr/share/perl/5.36.0/pod/*.pod except perl*delta.pod,
#                                                          rendered with pod2text (from perl)
#   jargon-text [4.4.7-4.1]                                /usr/share/doc/jargon-text/jargon.txt.gz
#   gnu-standards [2022.03.23-0.1]                         /usr/share/doc/gnu-standards/{standards,maintain}.text.gz
#   base-files (always installed)                          /usr/share/common-licenses/* (regular files)
#
# Cleaning: UTF-8 with invalid bytes replaced, CRLF → LF, form feeds and NULs dropped, trailing blanks stripped,
# runs of 3+ blank lines collapsed to one. Documents: each fortune; each file of the other sources, cut at blank
# lines into pieces of at most ~4000 characters. Split: a document is held out when the first byte of
# sha1("<source>/<file>#<piece>") is < 3 (3/256 ≈ 1.2 %); everything else is training text. The output is sorted
# by that key, so two runs on the same package versions give byte-identical files.
#
# Writes OUT_DIR/train.jsonl and OUT_DIR/val.jsonl ({"source": ..., "text": ...} per line) and OUT_DIR/stats.txt.
set -euo pipefail
OUT=${1:?usage: $0 OUT_DIR}
PACKAGES=(fortunes fortunes-min python3.11-doc perl-doc jargon-text gnu-standards)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
mkdir -p "$OUT"
for p in "${PACKAGES[@]}" base-files perl; do
  echo "$p $(dpkg-query -W -f='${Version}' "$p")"
done >"$OUT/packages.txt"

python3 - "$OUT" <<'EOF'
import glob, gzip, hashlib, json, os, re, subprocess, sys

out = sys.argv[1]
docs = []  # (key, source, text)


def clean(text):
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\f", "").replace("\x00", "")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n")


def add_pieces(source, name, text, limit=4000):
    text = clean(text)
    piece, n = [], 0
    parts = text.split("\n\n")
    for i, para in enumerate(parts):
        piece.append(para)
        n += len(para) + 2
        if n >= limit or i == len(parts) - 1:
            body = "\n\n".join(piece).strip("\n")
            if body.strip():
                key = f"{source}/{name}#{len(docs)}"
                docs.append((key, source, body))
            piece, n = [], 0


def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if "." in os.path.basename(path) or os.path.islink(path) or not os.path.isfile(path):
        continue
    for i, cookie in enumerate(re.split(r"^%$", read(path), flags=re.M)):
        body = clean(cookie)
        if body.strip():
            docs.append((f"fortunes/{os.path.basename(path)}#{i}", "fortunes", body))

for path in sorted(glob.glob("/usr/share/doc/python3.11/html/_sources/**/*.rst.txt", recursive=True)):
    add_pieces("python3.11-doc", os.path.relpath(path, "/usr/share/doc/python3.11/html/_sources"), read(path))

for path in sorted(glob.glob("/usr/share/perl/5.36.0/pod/*.pod")):
    if re.search(r"perl\d*delta\.pod$", path):
        continue
    text = subprocess.run(["pod2text", "-w", "76", path], check=True, capture_output=True).stdout
    add_pieces("perl-doc", os.path.basename(path), text.decode("utf-8", "replace"))

add_pieces("jargon-text", "jargon.txt", read("/usr/share/doc/jargon-text/jargon.txt.gz"))
for name in ("standards", "maintain"):
    add_pieces("gnu-standards", name, read(f"/usr/share/doc/gnu-standards/{name}.text.gz"))

for path in sorted(glob.glob("/usr/share/common-licenses/*")):
    if os.path.isfile(path) and not os.path.islink(path):
        add_pieces("common-licenses", os.path.basename(path), read(path))

docs.sort(key=lambda d: hashlib.sha1(d[0].encode()).hexdigest())
stats = {}
with open(os.path.join(out, "train.jsonl"), "w") as tr, open(os.path.join(out, "val.jsonl"), "w") as va:
    for key, source, text in docs:
        held_out = hashlib.sha1(key.encode()).digest()[0] < 3
        (va if held_out else tr).write(json.dumps({"source": source, "text": text}, ensure_ascii=False) + "\n")
        s = stats.setdefault(source, [0, 0, 0, 0])
        s[2 if held_out else 0] += 1
        s[3 if held_out else 1] += len(text.encode())
with open(os.path.join(out, "stats.txt"), "w") as f:
    f.write("source train_docs train_bytes val_docs val_bytes\n")
    for source, s in sorted(stats.items()):
        f.write(f"{source} {s[0]} {s[1]} {s[2]} {s[3]}\n")
print(open(os.path.join(out, "stats.txt")).read(), end="")
EOF

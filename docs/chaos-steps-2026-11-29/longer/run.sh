# Longer `bench chaos --steps` runs. Run from the repository root with the venv active.
run() { seed=$1; shift; timeout 900 python -m tensorwire.bench chaos --duration 600 --gap 1 --stall 60 --seed $seed --no-progress --json docs/chaos-steps-2026-11-29/longer/c4-$seed.json "$@" > docs/chaos-steps-2026-11-29/longer/c4-$seed.txt 2>&1; echo "$seed ($*): exit $? $(tail -n 1 docs/chaos-steps-2026-11-29/longer/c4-$seed.txt)"; }
run 4701 --transport nixl --sync ssp --steps 15000
run 4702 --transport shm --sync asp --servers 3 --steps 15000
run 4703 --transport tcp --steps 15000 --wire-dtype float16 --optimizer momentum
run 4704 --transport grpc --sync asp --steps 4000
run 4705 --transport nixl --hosts separate --steps 10000

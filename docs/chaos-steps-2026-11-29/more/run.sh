# More `bench chaos --steps` runs, each varying the job otherwise. Run from the repository root with the venv active.
run() { seed=$1; shift; timeout 600 python -m tensorwire.bench chaos --duration 400 --gap 0.3 --stall 60 --seed $seed --no-progress --json docs/chaos-steps-2026-11-29/more/c3-$seed.json "$@" > docs/chaos-steps-2026-11-29/more/c3-$seed.txt 2>&1; echo "$seed ($*): exit $? $(tail -n 1 docs/chaos-steps-2026-11-29/more/c3-$seed.txt)"; }
run 4601 --transport tcp --hosts separate --steps 4000
run 4602 --transport tcp --hosts separate --steps 4000 --sync asp
run 4603 --transport nixl --hosts separate --steps 3000 --sync ssp
run 4604 --transport grpc-stream --hosts separate --steps 1500 --sync asp
run 4605 --transport shm --servers 3 --workers 4 --sync ssp --steps 3000
run 4606 --transport tcp --servers 1 --steps 4000
run 4607 --transport shm --sync asp --framework torch --steps 1500 --checkpoint-every 20
run 4608 --transport tcp --curve --steps 4000
run 4609 --transport shm --wire-dtype bfloat16 --optimizer adam --steps 4000

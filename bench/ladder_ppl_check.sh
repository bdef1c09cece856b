#!/bin/bash
# cross-check with llama.cpp's own llama-perplexity: the ladder vs plain q4_0, batches of 64 so that the
# ladder climbs its rungs inside each 512-token chunk (f16 144 -> q8_0 256 -> q4_0 512 cells)
T=${T:-$(.venv/bin/python native/build.py tools | tail -1)}  # run from the repo root
C=bench/corpus.txt
MODELS=${MODELS:-$HOME/.cache/lazykv/models}
OUT=${OUT:-/tmp/ladder-ppl}; mkdir -p $OUT
for M in $MODELS/SmolLM2-135M-Instruct.Q4_1.gguf $MODELS/gemma-3-270m-q4_k_m.gguf; do
  n=$OUT/$(basename $M .gguf)
  $T/llama-perplexity -m $M -f $C -c 512 -b 64 -ub 64 --chunks 12 -t 1 -fa on -ctk f16 -ctv f16 --kl-divergence-base $n.base > $n.f16.log 2>&1
  $T/llama-perplexity -m $M -c 512 -b 64 -ub 64 --chunks 12 -t 1 -fa on -ctk q4_0 -ctv q4_0 --kl-divergence-base $n.base --kl-divergence > $n.q4_0.log 2>&1
  LLAMA_KV_CACHE_LAZY_QUANT=1 $T/llama-perplexity -m $M -c 512 -b 64 -ub 64 --chunks 12 -t 1 -fa on -ctk q4_0 -ctv q4_0 --kl-divergence-base $n.base --kl-divergence > $n.ladder.log 2>&1
  LLAMA_KV_CACHE_LAZY_QUANT=1 $T/llama-perplexity -m $M -c 512 -b 64 -ub 64 --chunks 12 -t 1 -fa on -ctk q5_0 -ctv q5_0 --kl-divergence-base $n.base --kl-divergence > $n.ladder-q5.log 2>&1
  $T/llama-perplexity -m $M -c 512 -b 64 -ub 64 --chunks 12 -t 1 -fa on -ctk q5_0 -ctv q5_0 --kl-divergence-base $n.base --kl-divergence > $n.q5_0.log 2>&1
done
grep -H "Mean    KLD\|Same top p" $OUT/*.log

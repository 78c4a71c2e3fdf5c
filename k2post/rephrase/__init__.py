"""Knowledge rephrasing (K2's rephrase-instead-of-repeat data augmentation): long documents cut into chunks at
sentence ends, each chunk rewritten in a style / perspective conditioned on the rewritten chunks before it, each
rewritten chunk checked for fidelity (retried, else the rewrite is dropped and counted), the pieces joined into a
rephrased document; out comes an HF dataset with provenance (source id, chunk ids, style, rewrite index, fidelity).

    k2post rephrase configs/rephrase_demo.yaml out_dir=runs/rephrase        # offline demo, seconds
    k2post rephrase CONFIG backend=llm input.path=data/docs.jsonl llm.base_url=http://127.0.0.1:8000/v1
    k2post rephrase --resume runs/rephrase                                  # continue a cut run

Modules:
- `config`: the `kind: rephrase` run config (`RephraseConfig`);
- `corpus`: a synthetic knowledge corpus (invented people, companies, cities with attributes and relations),
  documents in several template styles and fact orders, closed-book questions unlike any document wording;
- `chunking`: sentence splitting and sentence-end chunking under a token budget;
- `prompts`: the rewrite and judge prompts;
- `rewriters`: the `Rewriter` seam: `LLMRewriter` (any `LLMClient`: HTTP or an in-process `EngineLLMClient`) and
  `BuiltinRewriter` (the synthetic corpus re-rendered offline);
- `fidelity`: the deterministic checks and the `ChunkJudge`s (`ChecksJudge`, `LLMChunkJudge`, `ModelChunkJudge`
  over a trained sentence-level faithfulness judge);
- `pipeline`: `run_rephrase(cfg)`: documents, shards (resume), progress, stats.json, dropped.jsonl, the dataset.

Docs: docs/REPHRASE.md.
"""

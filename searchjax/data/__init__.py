"""Training data (RECIPE.md §1, §3): synthetic QA, rubric chat data, SFT data, public QA sets, grain pipelines.

Modules (imported directly; this package imports nothing so that searchjax.search can use
`searchjax.data.jsonl` without an import cycle):
- `jsonl`: `read_jsonl` / `iter_jsonl` / `write_jsonl`, `DataError` (file:line), `ReadSummary` (skip and count).
- `questions`: entity-free nested questions — `describe`, `write_question`, `parse_question`, `Step`.
- `solvers`: `KBSolver` (set resolution in the knowledge base), `SearchSolver` (search_web calls only).
- `synth`: `QAGenerator`, `SynthConfig`, `validate_qa_record`, the output schema (`RECORD_FIELDS`).
- `rubric_data`: `generate_rubric_records`, `LLMRubricGenerator`, `calibrate_pass_at_k`.
- `sft`: `SFTBuilder` (trajectories, abstention), `preference_example`, `validate_sft_record`.
- `public`: `load_public_qa` (SimpleQA, FRAMES, Bamboogle, SealQA, WebWalkerQA, DeepDive), `quality_filter`.
- `prompts`: `system_message`, `prompt_messages` — the one prompt format of every example.
- `pipeline`: `PipelineConfig`, `SourceConfig`, `build_dataset`, `make_iterator`, `load_sources`.
Rubric checks and judges live in `searchjax.rewards.rubrics`.
"""

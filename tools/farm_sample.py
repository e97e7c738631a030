"""farm-sample: n outputs per instruction from a model (transformers, vLLM or an OpenAI-compatible
endpoint), as output records with n samples per prompt consecutive, in input order."""

from __future__ import annotations

import click

from farmkit.cli import (
    common_options,
    decoding_options,
    entry_point,
    field_options,
    input_argument,
    log,
    long_prompts_option,
    model_options,
    output_option,
    seed_option,
    shared_option,
    split_option,
)
from farmkit.core.io import FarmError, display_name, read_numbered
from farmkit.core.provenance import config_hash, provenance, stamp
from farmkit.lm.sampling import SampleSettings

TOOL = "farm-sample"


@click.command(name=TOOL)
@click.argument("model")
@input_argument("prompts")
@split_option
@shared_option(
    "num_samples",
    2,
    dest="n",
    more_help="They are written consecutively. The default 2 is the pair farm-annotate judges "
    "(AlpacaFarm samples 2 per preference instruction); use -n 1 for evaluation.",
)
@decoding_options(
    temperature=0.7,
    generation_batch_size=32,
    batch_aliases=("--batch-size",),
    batch_dest="batch_size",
)
@field_options(SampleSettings, "backend", "generator", defaults={"backend": "auto"})
@model_options
@field_options(SampleSettings, "dtype", "concurrency", "compile_generation")
@shared_option("resume", more_help="With -o: from FILE.resume.jsonl.")
@long_prompts_option
@output_option
@seed_option
@common_options
def cli(
    model,
    prompts,
    n,
    temperature,
    top_p,
    max_new_tokens,
    batch_size,
    backend,
    generator,
    template,
    device,
    dtype,
    concurrency,
    compile_generation,
    resume,
    long_prompts,
    output,
    seed,
):
    """Sample outputs of MODEL for the instructions in PROMPTS (JSONL; `-` or nothing: stdin).

    MODEL is `embedded`, a model folder, a .gguf file, a hub id, or with --backend openai a model name
    at the endpoint. Each output record keeps the prompt's other fields and adds output, generator,
    sample_index, the decoding settings, seed and provenance. A model folder trained with reward
    conditioning gets its control token added to every prompt.
    """
    from farmkit.core import distributed

    if distributed.launched() and prompts == "-":
        raise click.UsageError(
            "under a launcher every process reads the prompts: give a file, not stdin"
        )
    if resume and output == "-":
        raise click.UsageError(
            "--resume needs -o FILE (the run's progress is kept beside that file)"
        )
    numbered = read_numbered(prompts, "instruction")
    records = [record for _, record in numbered]
    if not records:
        if output != "-":
            from farmkit.core.io import write_records

            write_records([], output)
        return

    from farmkit.lm.generation import DecodingConfig
    from farmkit.lm.sampling import (
        default_backend,
        generator_name,
        sample_to_output,
    )

    if backend == "auto":
        backend = default_backend(device)
    if compile_generation and backend != "hf":
        raise click.UsageError(
            f"--compile-generation is for the hf backend (transformers' generate), not {backend}"
        )
    if backend != "openai":  # an endpoint's context is unknown here: it answers for itself
        from farmkit.lm.sampling import screen_long_prompts

        records = screen_long_prompts(model, numbered, template, max_new_tokens, long_prompts)
        if not records:
            raise FarmError(
                f"{display_name(prompts)}: every prompt is over-long; nothing to sample"
            )
    decoding = DecodingConfig(
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
    )
    settings = SampleSettings(
        model=model,
        backend=backend,
        decoding=decoding,
        seed=seed,
        template=template,
        device=device,
        dtype=dtype,
        concurrency=concurrency,
        generator=generator,
        compile_generation=compile_generation,
    )
    control = None
    if backend != "openai":
        from farmkit.lm.models import PromptFormat, resolve

        control = PromptFormat.for_model(resolve(model), template).control
        if control:
            log.info(
                "%s: the model folder asks for the control token %s; it is added to every prompt",
                TOOL,
                control,
            )
    name = settings.generator or (model if backend == "openai" else generator_name(model))
    info = provenance(
        TOOL,
        seed,
        model=model,
        backend=backend,
        template=template,
        control=control,
        batch_size=batch_size if backend == "hf" else None,
        # compiled decoding may differ from eager in the last bits: a record says how it was drawn
        compile_generation=compile_generation or None,
    )
    fields = {**decoding.as_record_fields(), "seed": seed}

    def make_records(record: dict, samples: list) -> list[dict]:
        made = []
        for sample_index, sample in enumerate(samples):
            out = {
                **record,
                "input": record.get("input") or "",
                "output": sample.text,
                "generator": name,
                "sample_index": sample_index,
                **fields,
            }
            made.append(stamp(out, TOOL, info))
        return made

    fingerprint = {
        "records": config_hash({"records": records}),
        "settings": info,
        "n": n,
        "generator": name,
        **fields,
    }
    figures = sample_to_output(
        records, settings, make_records, output=output, resume=resume, fingerprint=fingerprint
    )
    log.info(
        "%s: %d prompts x %d samples, %d tokens in %.1f s (%.1f tokens/s)",
        TOOL,
        len(records),
        n,
        figures["completion_tokens"],
        figures["seconds"],
        figures["tokens_per_second"],
    )


main = entry_point(cli)

if __name__ == "__main__":
    main()

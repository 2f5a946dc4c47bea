//! Each command's parsed arguments to its `crate::commands` call, and the summary it prints.

use anyhow::Result;

use super::{pick_device, Cli, Cmd};
use crate::commands::model_load;
use crate::commands::tokenize;
use crate::job::exit::{ExitCode as Code, UsageError};

/// A command's summary on stdout: JSON with `--json`, else its text form.
pub fn print_report<T: serde::Serialize>(json: bool, value: &T, text: String) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{text}");
    }
    Ok(())
}

/// `quantize`, and `convert` of a GGUF: the summary printed, exit 1 when verification failed.
pub fn quantize(args: &crate::commands::quantize::QuantizeArgs, json: bool) -> Result<Code> {
    let summary = crate::commands::quantize::run(args)?;
    print_report(json, &summary, summary.to_text())?;
    Ok(if summary.passed() { Code::Ok } else { Code::Failure })
}

/// Runs the parsed command; its result is the process's exit code (`crate::job::exit`).
pub fn run(cli: Cli) -> Result<Code> {
    match cli.cmd {
        Cmd::Tokenize(a) => {
            // Checked before the model loads.
            crate::job::outputs::check_output(&a.output, &[&a.input, &a.model])?;
            crate::job::outputs::check_input_file("--input", &a.input)?;
            let t = model_load::load_tokenizer(&a.model)?;
            let errors = tokenize::run(&t.tokenizer, &a.input, &a.output)?;
            Ok(if errors > 0 { Code::RecordErrors } else { Code::Ok })
        }
        Cmd::Run(a) => {
            let default_max_tokens = match (&a.pipeline, a.default_max_tokens) {
                (Some(_), Some(_)) => {
                    return Err(crate::job::exit::UsageError::new(
                        "--default-max-tokens is for OpenAI batch input (no pipeline): a pipeline sets \
                         generation.max_tokens",
                    )
                    .into())
                }
                (_, Some(0)) => {
                    return Err(crate::job::exit::UsageError::new(
                        "--default-max-tokens 0: a request without max_tokens would generate nothing",
                    )
                    .into())
                }
                (_, n) => n.unwrap_or(256),
            };
            let device = pick_device(&a.model.device)?;
            let max_batch_tokens = a.engine.max_batch_tokens(&device);
            let args = crate::commands::run::RunArgs {
                pipeline: a.pipeline,
                pipelines_dir: a.pipelines,
                inputs: a.input,
                output: crate::job::outputs::follow_link(&a.output),
                model: a.model.model,
                device,
                device_flag: a.model.device,
                devices: a.devices,
                engines: a.engines,
                tensor_parallel: a.engine.tensor_parallel,
                ptx_dir: a.model.ptx_dir,
                memory: a.engine.memory(),
                slots: a.engine.slots,
                max_batch_tokens,
                prefix_cache: !a.engine.no_prefix_cache,
                restart: a.restart,
                incremental: a.incremental,
                max_errors: a.max_errors,
                tolerance: crate::job::tolerance::ErrorTolerance::new(a.allow_errors, a.max_error_rate)?,
                shard: a.shard,
                shard_count: a.shard_count,
                dry_run: a.dry_run,
                json: a.json,
                quiet: a.quiet,
                default_max_tokens,
            };
            crate::commands::run::run(&args)
        }
        Cmd::Convert(a) if a.model.is_file() => {
            // GGUF -> GGUF: a type change of every matrix (e.g. a quantized model to an F16
            // reference), done by the quantizer with its mix rules for --dtype.
            let hf_only = [
                (a.allow_lossy, "--allow-lossy"),
                (a.max_lossy_fraction.is_some(), "--max-lossy-fraction"),
                (a.verify_tokens.is_some(), "--verify-tokens"),
                (a.verify_prompt.is_some(), "--verify-prompt"),
            ];
            if let Some((_, flag)) = hf_only.iter().find(|(given, _)| *given) {
                return Err(crate::job::exit::UsageError::new(format!(
                    "{flag} applies to a Hugging Face directory; a GGUF --model is re-typed by the quantizer, whose check is --verify (a perplexity and KL comparison, --verify-max-kl)"
                ))
                .into());
            }
            if crate::quantize::mix::QuantType::parse(&a.dtype).is_none() {
                return Err(crate::job::exit::UsageError::new(format!(
                    "unknown --dtype {:?}; one of {}",
                    a.dtype,
                    crate::quantize::mix::TYPE_NAMES
                ))
                .into());
            }
            let args = crate::commands::quantize::QuantizeArgs {
                model: a.model,
                output: a.output,
                qtype: a.dtype,
                allow_requantize: true,
                verify: a.verify,
                verify_max_kl: a.verify_max_kl,
                threads: cli.threads,
                ..Default::default()
            };
            quantize(&args, a.json)
        }
        Cmd::Convert(a) => {
            let defaults = crate::commands::convert::ConvertArgs::default();
            let args = crate::commands::convert::ConvertArgs {
                model: a.model,
                output: a.output,
                dtype: a.dtype,
                allow_lossy: a.allow_lossy,
                max_lossy_fraction: a.max_lossy_fraction.unwrap_or(defaults.max_lossy_fraction),
                verify: a.verify || a.verify_max_kl.is_some(),
                verify_tokens: a.verify_tokens.unwrap_or(defaults.verify_tokens),
                verify_prompt: a.verify_prompt.unwrap_or(defaults.verify_prompt),
                verify_max_kl: a.verify_max_kl,
            };
            let summary = crate::commands::convert::run(args)?;
            print_report(a.json, &summary, summary.to_text())?;
            Ok(if summary.passed() { Code::Ok } else { Code::Failure })
        }
        Cmd::Doctor(a) => {
            let args = crate::commands::doctor::DoctorArgs {
                model: a.model,
                ctx: a.ctx,
                slots: a.slots,
                ptx_dir: a.ptx_dir,
                numa: cli.numa,
                threads: cli.threads,
                measure: !a.no_measure,
                require_gpu: a.require_gpu,
            };
            let report = crate::commands::doctor::run(&args)?;
            print_report(a.json, &report, report.to_text())?;
            Ok(report.exit)
        }
        Cmd::Quantize(a) => {
            let args = crate::commands::quantize::QuantizeArgs {
                model: a.model,
                output: a.output,
                qtype: a.qtype,
                calibration: a.calibration,
                calibration_tokens: a.calibration_tokens,
                calibration_ctx: a.calibration_ctx,
                imatrix: a.imatrix,
                imatrix_out: a.imatrix_out,
                allow_requantize: a.allow_requantize,
                threads: cli.threads,
                verify: a.verify,
                verify_max_kl: a.verify_max_kl,
                pipeline: a.pipeline,
                device: a.device,
            };
            quantize(&args, a.json)
        }
        Cmd::Eval(a) => {
            let args = crate::commands::eval::EvalArgs {
                models: a.model,
                reference: a.reference,
                text: a.text,
                ctx: a.ctx,
                max_tokens: a.max_tokens,
                kv_type: a.kv_cache.or_f16(),
                device: a.device,
                ptx_dir: a.ptx_dir,
                batch_windows: a.batch_windows,
            };
            let summary = crate::commands::eval::run(&args)?;
            print_report(a.json, &summary, summary.to_text())?;
            Ok(Code::Ok)
        }
        Cmd::Synth(a) => {
            // A missing tokenizer is a missing input (exit 2), found before any work.
            if !a.tokenizer.join("tokenizer.json").is_file() {
                return Err(UsageError::new(format!(
                    "--tokenizer {}: no tokenizer.json there (give a Hugging Face model directory)",
                    a.tokenizer.display()
                ))
                .into());
            }
            // Not into the tokenizer's directory, not a directory: refused before the weights are made.
            crate::job::outputs::check_output(&a.output, &[&a.tokenizer])?;
            let o = crate::model::synth_gguf::SynthOptions {
                shape: a.shape,
                qtype: a.qtype,
                tokenizer: a.tokenizer,
                output: a.output,
                seed: a.seed,
                force: a.force,
                layers: a.layers,
            };
            let summary = crate::commands::synth::run(&o, a.quiet)?;
            print_report(a.json, &summary, format!("{}\n", summary.to_text()))?;
            Ok(Code::Ok)
        }
        Cmd::Merge(a) => crate::commands::run::merge(&crate::job::outputs::follow_link(&a.output), &a.shards),
        Cmd::Kernels(a) => {
            let files = crate::commands::kernels::compile_all(&a.arch, &a.out)?;
            for f in &files {
                println!("{}", f.display());
            }
            Ok(Code::Ok)
        }
        Cmd::Bench(a) => {
            let opts = crate::commands::bench_modes::BenchOptions {
                device: pick_device(&a.device)?,
                model: a.model,
                synthetic: a.synthetic,
                layers: a.layers,
                dtype: a.dtype,
                f16_weights: a.weights == "f16",
                ptx_dir: a.ptx_dir,
                prompt_tokens: a.prompt_tokens,
                gen_tokens: a.gen_tokens,
                runs: a.runs,
                json: a.json,
                batch: a.batch,
                shared_prefix: a.shared_prefix,
                slots: a.slots,
                constrained: a.constrained,
                max_batch_tokens: a.max_batch_tokens,
                plan: a.plan,
                plan_free_gb: a.plan_free_gb,
                tensor_parallel: a.tensor_parallel,
                devices: a.devices,
                max_gpu_memory: a.max_gpu_memory,
                kv_type: a.kv_cache.or_f16(),
            };
            crate::commands::bench_modes::run(&opts)
        }
        Cmd::Generate(a) => super::generate_cmd::generate(a),
    }
}

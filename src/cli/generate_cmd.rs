//! The `generate` command: a prompt streamed to stdout, or a JSONL file of prompts run as a job
//! (the run loop of `job::runner`, with its checkpoint, lock and signals).

use anyhow::Result;

use super::job_args::*;
use super::pick_device;

use crate::commands::generate;
use crate::commands::job_settings;
use crate::commands::model_load;
use crate::commands::placement;
use crate::commands::slots;
use crate::job::exit::{ExitCode as Code, UsageError};

/// `generate`: one `--prompt` streamed, or `--input` lines as a job of the run loop (resumable,
/// checkpointed like `run`).
pub fn generate(a: GenerateArgs) -> Result<Code> {
    if a.max_tokens == 0 {
        return Err(UsageError::new("--max-tokens 0 would generate nothing; give at least 1").into());
    }
    if a.ctx == 0 {
        return Err(UsageError::new("--ctx 0 leaves no room for a prompt; give at least 1").into());
    }
    // As the OpenAI batch input's checks: nonsense sampling values are refused, not clamped.
    if !(a.temperature.is_finite() && (0.0..=100.0).contains(&a.temperature)) {
        return Err(
            UsageError::new(format!("--temperature {}: give a number 0..=100 (0: greedy)", a.temperature)).into()
        );
    }
    if !(a.top_p > 0.0 && a.top_p <= 1.0) {
        return Err(UsageError::new(format!("--top-p {}: give a number in (0, 1] (1: off)", a.top_p)).into());
    }
    let opt = generate::GenOptions {
        max_tokens: a.max_tokens,
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
    };
    match (a.prompt, a.input, a.output) {
        (Some(p), _, _) => {
            let device = pick_device(&a.model.device)?;
            let m = model_load::load(&a.model.model)?;
            // Positions past the model's context give garbage: --ctx (4096 by default) is held
            // to it, and a prompt that then does not fit is refused below.
            let ctx = match m.config.max_context {
                0 => a.ctx,
                most if a.ctx > most => {
                    eprintln!("--ctx {} is past the model's context of {most} positions: using {most}", a.ctx);
                    most
                }
                _ => a.ctx,
            };
            let step = crate::engine::single::PREFILL_CHUNK;
            let place = placement::Placement {
                ptx_dir: a.model.ptx_dir.clone(),
                f16_weights: false,
                max_gpu_memory: a.engine.max_gpu_memory,
                kv_type: a.engine.kv_cache.or_f16(),
                max_seq_positions: None,
            };
            let mut b = crate::commands::tensor_parallel::backend_for(
                &m.config,
                &m.weights,
                &device,
                a.engine.tensor_parallel,
                None,
                ctx,
                (step, 1),
                &place,
            )?;
            generate::run_prompt(&m, b.as_mut(), &p, a.chat, &opt, ctx)?;
            Ok(Code::Ok)
        }
        (None, Some(i), Some(o)) => {
            let o = crate::job::outputs::follow_link(&o);
            crate::job::outputs::check_input_file("--input", &i)?;
            if crate::job::writer::OutputFormat::from_path(&o) != crate::job::writer::OutputFormat::Jsonl {
                return Err(
                    UsageError::new(format!("generate writes JSONL: {} is not a .jsonl path", o.display())).into()
                );
            }
            if a.chat {
                return Err(UsageError::new(
                    "--chat wraps --prompt; for --input lines put \"chat\": true in each line that wants the chat template",
                )
                .into());
            }
            if crate::job::reader::InputFormat::from_path(&i) == crate::job::reader::InputFormat::Parquet {
                return Err(UsageError::new(format!(
                    "generate reads JSONL prompts: {} is a Parquet file (`run` with a pipeline reads Parquet)",
                    i.display()
                ))
                .into());
            }
            let device = pick_device(&a.model.device)?;
            // Before the model loads: an output that would overwrite the input, or a
            // second run of this job, is refused at once.
            crate::job::outputs::check_output(&o, &[&i, &a.model.model])?;
            let lock = crate::job::lock::JobLock::acquire(&o)?;
            let job = generate::BatchJob {
                model_path: &a.model.model,
                input: &i,
                output: &o,
                ctx: a.ctx,
                restart: a.restart,
                commit_rows: job_settings::commit_rows(),
            };
            let fingerprint = generate::fingerprint(&job, &opt)?;
            // As `run`: the finished output of this same job is not computed again, that of
            // another job (other options) or a file no run wrote is not replaced unasked.
            let unfinished = crate::job::checkpoint::has_started_job(&o);
            if let crate::job::identity::Decision::NothingToDo(f) =
                crate::job::identity::decide(&o, &fingerprint, a.restart, false, unfinished)?
            {
                // As `run`: the leftover of a finish killed while removing its checkpoint.
                if let Err(e) = crate::job::checkpoint::remove_leftover(&o) {
                    eprintln!("warning: the finished job's leftover checkpoint stays: {e}");
                }
                let tolerance = crate::job::tolerance::ErrorTolerance::default();
                return Ok(crate::job::exit::nothing_to_do(&o, &f, &tolerance, "model, input and options"));
            }
            crate::job::checkpoint::Checkpoint::verify(&o, &fingerprint, a.restart)
                .map_err(|e| anyhow::anyhow!(e).context(format!("opening the checkpoint of {}", o.display())))?;
            let m = model_load::load(&a.model.model)?;
            let max_batch_tokens = a.engine.max_batch_tokens(&device);
            let (slots, kv_type) = crate::commands::tensor_parallel::slots_for(
                a.engine.slots,
                &device,
                (&m.config, &m.weights),
                a.engine.tensor_parallel,
                (a.ctx, max_batch_tokens),
                a.engine.memory(),
            )?;
            let cfg = crate::engine::batch::EngineConfig::new(
                slots,
                max_batch_tokens,
                !a.engine.no_prefix_cache,
                m.fingerprint,
            );
            let place = placement::Placement {
                ptx_dir: a.model.ptx_dir.clone(),
                f16_weights: false,
                max_gpu_memory: a.engine.max_gpu_memory,
                kv_type,
                // Each line runs within --ctx positions.
                max_seq_positions: Some(a.ctx),
            };
            let tokens = match a.engine.tensor_parallel {
                None => {
                    slots::kv_positions(&device, (&m.config, &m.weights), (slots, a.ctx), cfg.max_batch_tokens, &place)?
                }
                Some(_) => a.ctx * slots,
            };
            let backend = crate::commands::tensor_parallel::backend_for(
                &m.config,
                &m.weights,
                &device,
                a.engine.tensor_parallel,
                None,
                tokens,
                (cfg.max_batch_tokens, slots),
                &place,
            )?;
            let engine = crate::engine::batch::Engine::new(backend, cfg)?;
            let stop = crate::job::runner::StopFlag::with_signals().unwrap_or_default();
            let mut gen = crate::job::adapters::EngineGenerate::new(engine, m.tokenizer.eos_ids().to_vec())
                .with_stop(stop.clone());
            let r = generate::run_jsonl(&m, &mut gen, &job, &opt, &lock, &stop)?;
            eprintln!("metrics: {}", serde_json::to_string(&r.metrics)?);
            eprintln!(
                "{} rows committed ({} from an earlier run), {} error rows",
                r.rows, r.resumed_rows, r.error_rows
            );
            if r.exit == Code::Interrupted {
                eprintln!("interrupted: run the same command again to resume");
            }
            Ok(r.exit)
        }
        _ => Err(UsageError::new("give either --prompt TEXT or --input IN.jsonl --output OUT.jsonl").into()),
    }
}

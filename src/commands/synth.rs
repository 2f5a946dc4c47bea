//! `dustoff synth`: writes a random-weight GGUF of a real model's shape (see
//! `model::synth_gguf`), with a progress line on stderr while the tensors are written.

use std::io::{IsTerminal, Write};

use crate::job::exit::UsageError;
use crate::model::synth_gguf::{write_synthetic_gguf, SynthOptions, SynthSummary};

pub fn run(o: &SynthOptions, quiet: bool) -> anyhow::Result<SynthSummary> {
    // Ctrl-C stops between tensors, removing what was written.
    crate::sys::interrupt::install();
    let mut last = 0u64;
    let r = write_synthetic_gguf(o, |done, total| {
        // A line per tenth of the data: a 30B-A3B file is ~18.5 GB.
        let tenth = (total / 10).max(1);
        if !quiet && (done / tenth > last / tenth || done == total) {
            let (done_gb, total_gb) = (done as f64 / 1e9, total as f64 / 1e9);
            if std::io::stderr().is_terminal() {
                // One line rewritten in place.
                eprint!("\rsynth: {done_gb:.1} / {total_gb:.1} GB");
                std::io::stderr().flush().ok();
                if done == total {
                    eprintln!();
                }
            } else {
                // A log gets a line each.
                eprintln!("synth: {done_gb:.1} / {total_gb:.1} GB");
            }
        }
        last = done;
    });
    match r {
        Ok(s) => Ok(s),
        Err(e) if e.is_usage() => Err(UsageError::new(e.to_string()).into()),
        Err(e) => Err(e.into()),
    }
}

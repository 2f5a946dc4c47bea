//! Checks on an output path before any work: none of the files a job writes for it (the output,
//! its temporary, report, order sidecar, checkpoint directory, lock) is or contains an input
//! (`--output` naming the input file used to overwrite it, exit 0), and its directory exists or
//! can be made (a missing one used to fail `generate` and `tokenize` after all the work).

use std::path::{Component, Path, PathBuf};

use super::usage::UsageError;

/// Every path a job writes for `output` (files, and the checkpoint directory).
pub fn owned_paths(output: &Path) -> Vec<PathBuf> {
    let with = |suffix: &str| {
        let mut p = output.as_os_str().to_owned();
        p.push(suffix);
        PathBuf::from(p)
    };
    vec![
        output.to_path_buf(),
        with(".partial"),
        with(".report.json"),
        with(".report.json.tmp"),
        super::shard::order_path(output),
        super::incremental::digests_path(output),
        with(".digests.tsv.partial"),
        super::errors_file::errors_path(output),
        with(".errors.jsonl.tmp"),
        super::checkpoint::checkpoint_dir(output),
        super::checkpoint::discard_dir(&super::checkpoint::checkpoint_dir(output)),
        super::lock::JobLock::path_for(output),
    ]
}

/// `path` made absolute and free of `.`/`..`, through the real location of its directory when
/// that exists (so a symlinked directory compares equal to its target).
fn normalize(path: &Path) -> PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map(|d| d.join(path)).unwrap_or_else(|_| path.to_path_buf())
    };
    if let (Some(parent), Some(name)) = (abs.parent(), abs.file_name()) {
        if let Ok(p) = parent.canonicalize() {
            return p.join(name);
        }
    }
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// The file `output` names: itself, or where it points when it is a symbolic link (followed
/// to the end; a link to a file not made yet, to that file). Everything a job keeps for its
/// output (checkpoint, lock, report) then sits beside the file the rows go to: through the link
/// a second run found no lock of the first, and the finished rows replaced the link itself
/// while the file it named kept the old ones.
pub fn follow_link(output: &Path) -> PathBuf {
    let is_link = std::fs::symlink_metadata(output).is_ok_and(|m| m.file_type().is_symlink());
    if !is_link {
        return output.to_path_buf();
    }
    let target = output.canonicalize().ok().or_else(|| {
        let t = std::fs::read_link(output).ok()?;
        let dir = output.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        Some(if t.is_relative() { dir.join(t) } else { t })
    });
    match target {
        Some(t) => {
            eprintln!("--output {} is a symbolic link: writing the file it names, {}", output.display(), t.display());
            t
        }
        None => output.to_path_buf(),
    }
}

/// Refuses an output that is a directory or whose files would overwrite or live around one of
/// `inputs` (input files, the model, the pipeline) with a [`UsageError`], before anything is
/// written; then makes the output's directory if it is missing.
pub fn check_output(output: &Path, inputs: &[&Path]) -> Result<(), OutputError> {
    refuse_overlap(output, inputs)?;
    if let Some(why) = super::writer::compressed_name(output) {
        return Err(UsageError::new(why).into());
    }
    let parent = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        std::fs::create_dir_all(parent).map_err(|source| OutputError::CreateDir {
            dir: parent.to_path_buf(),
            output: output.to_path_buf(),
            source,
        })?;
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error(transparent)]
    Usage(#[from] UsageError),
    #[error("cannot create {dir}, the directory of the output {output}: {source}")]
    CreateDir { dir: PathBuf, output: PathBuf, source: std::io::Error },
}

/// Whether two paths name the same file (made absolute, through the real location of their
/// directories), whether or not it exists yet.
pub fn same_path(a: &Path, b: &Path) -> bool {
    normalize(a) == normalize(b)
}

/// A file the command reads, given as `flag`: refused with a [`UsageError`] (exit 2) when it is
/// missing or a directory, before anything is written.
pub fn check_input_file(flag: &str, path: &Path) -> Result<(), UsageError> {
    if path.is_dir() {
        return Err(UsageError::new(format!("{flag} {} is a directory; name a file", path.display())));
    }
    if !path.is_file() {
        return Err(UsageError::new(format!("{flag} {} does not exist", path.display())));
    }
    Ok(())
}

fn refuse_overlap(output: &Path, inputs: &[&Path]) -> Result<(), UsageError> {
    let shown = output.display();
    if output.as_os_str().is_empty() {
        return Err(UsageError::new("--output is empty"));
    }
    if output.is_dir() {
        return Err(UsageError::new(format!("--output {shown} is a directory; name a file in it")));
    }
    if output.as_os_str().as_encoded_bytes().ends_with(b"/") {
        return Err(UsageError::new(format!("--output {shown} names a folder (it ends in /); name a file")));
    }
    let inputs: Vec<(PathBuf, &Path)> = inputs.iter().map(|p| (normalize(p), *p)).collect();
    for owned in owned_paths(output) {
        let o = normalize(&owned);
        for (i, given) in &inputs {
            if *i == o || i.starts_with(&o) {
                let what = if owned == output { "--output".to_string() } else { format!("{}", owned.display()) };
                return Err(UsageError::new(format!(
                    "{what} would overwrite the input {}; choose another --output",
                    given.display()
                )));
            }
            // Inside an input directory (a Hugging Face model): its files would be replaced.
            if o.starts_with(i) && given.is_dir() {
                return Err(UsageError::new(format!(
                    "--output {shown} is inside the input directory {}; choose another --output",
                    given.display()
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_that_are_or_hold_an_input_are_refused() {
        let d = std::env::temp_dir().join(format!("dustoff-outputs-{}", std::process::id()));
        std::fs::create_dir_all(d.join("sub")).unwrap();
        let input = d.join("in.jsonl");
        std::fs::write(&input, "{}\n").unwrap();
        // The same file, by another spelling.
        let e = check_output(&d.join("sub/../in.jsonl"), &[&input]).unwrap_err().to_string();
        assert!(e.contains("would overwrite the input") && e.contains("in.jsonl"), "{e}");
        // An input inside the checkpoint directory of the output.
        let ck = d.join("o.jsonl.dustoff");
        std::fs::create_dir_all(&ck).unwrap();
        std::fs::write(ck.join("x.jsonl"), "{}\n").unwrap();
        assert!(check_output(&d.join("o.jsonl"), &[&ck.join("x.jsonl")]).is_err());
        // The input's report name: `in` as output would write `in.report.json`.
        let rep = d.join("r.jsonl.report.json");
        std::fs::write(&rep, "{}").unwrap();
        assert!(check_output(&d.join("r.jsonl"), &[&rep]).is_err());
        // Fine: another file in the same directory.
        check_output(&d.join("out.jsonl"), &[&input]).unwrap();
        // A missing directory is made; one that cannot be (under a file) is named; a directory
        // is not an output.
        check_output(&d.join("new/deeper/out.jsonl"), &[&input]).unwrap();
        assert!(d.join("new/deeper").is_dir());
        let model = d.join("hf");
        std::fs::create_dir_all(&model).unwrap();
        let e = check_output(&model.join("tokenizer.json"), &[&input, &model]).unwrap_err().to_string();
        assert!(e.contains("inside the input directory"), "{e}");
        assert!(check_input_file("--input", &d.join("missing.jsonl"))
            .unwrap_err()
            .to_string()
            .contains("does not exist"));
        assert!(check_input_file("--input", &model).unwrap_err().to_string().contains("is a directory"));
        check_input_file("--input", &input).unwrap();
        let e = check_output(&input.join("out.jsonl"), &[]).unwrap_err();
        assert!(matches!(e, OutputError::CreateDir { .. }), "{e}");
        assert!(check_output(&d, &[&input]).unwrap_err().to_string().contains("is a directory"));
        let e = check_output(&d.join("out.jsonl.gz"), &[&input]).unwrap_err().to_string();
        assert!(e.contains("not .gz"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}

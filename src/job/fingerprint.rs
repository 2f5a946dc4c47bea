//! What makes two runs the same job (`JobFingerprint`: the model, the pipeline, the parameters
//! that change rows, each input file, the shard) and the cheap identity of a file it is built
//! from. A checkpoint, a finished job's report and a shard's order file each store one; a run
//! whose fingerprint differs is refused or told what changed.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::shard::ShardSpec;

/// A file's identity: its size and a blake3 of its first and last MiB (`sample`), and for a
/// job's input files a blake3 of all of it (`content`). Independent of the path (a moved file
/// still resumes) and of mtime (a copy still resumes). Inputs are hashed whole because an
/// in-place edit of a record in the middle of a large file would otherwise go unnoticed (the
/// finished job said "nothing to do", a resume mixed old and new rows); models keep the sample
/// (GB-sized, replaced as whole files). Identities written before `content` existed compare
/// by size and sample alone, so their checkpoints still resume.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FileIdentity {
    pub name: String,
    pub size: u64,
    pub sample: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

impl PartialEq for FileIdentity {
    fn eq(&self, o: &Self) -> bool {
        let content = match (&self.content, &o.content) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        self.name == o.name && self.size == o.size && self.sample == o.sample && content
    }
}

impl Eq for FileIdentity {}

/// Bytes a file's sample hashes at each end.
const SPAN: u64 = 1 << 20;

/// Where a file of `size` bytes is sampled: its first MiB, and its last MiB where it is longer
/// (never overlapping the first).
fn sample_ranges(size: u64) -> [std::ops::Range<u64>; 2] {
    let tail = if size > SPAN { (size - SPAN).max(SPAN)..size } else { size..size };
    [0..SPAN.min(size), tail]
}

/// The identity named `path` with its size and the finished sample hash.
fn identity_of(path: &Path, size: u64, sample: blake3::Hasher) -> FileIdentity {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    FileIdentity { name, size, sample: sample.finalize().to_hex().to_string(), content: None }
}

/// The sampled identity of a file (no `content`): its two sample ranges read alone.
fn sampled_identity(path: &Path) -> std::io::Result<FileIdentity> {
    let mut f = File::open(path)?;
    let size = f.metadata()?.len();
    let mut h = blake3::Hasher::new();
    h.update(&size.to_le_bytes());
    for r in sample_ranges(size) {
        f.seek(SeekFrom::Start(r.start))?;
        let mut buf = Vec::with_capacity((r.end - r.start) as usize);
        (&mut f).take(r.end - r.start).read_to_end(&mut buf)?;
        if buf.len() as u64 != r.end - r.start {
            return Err(std::io::Error::other(format!("{} shrank while it was read", path.display())));
        }
        h.update(&buf);
    }
    Ok(identity_of(path, size, h))
}

/// The identity of a job's input file: its whole content hashed in one read (16 MiB reads, each
/// hashed on every core: a few seconds for 10 GB), the sample taken from the same reads.
pub fn file_identity(path: &Path) -> std::io::Result<FileIdentity> {
    let mut f = File::open(path)?;
    let size = f.metadata()?.len();
    let ranges = sample_ranges(size);
    let mut sample = blake3::Hasher::new();
    sample.update(&size.to_le_bytes());
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 16 << 20];
    let mut read = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let chunk = read..read + n as u64;
        // The parts of this read inside the sample ranges, in file order as the sample hashes them.
        for r in &ranges {
            let (a, b) = (r.start.max(chunk.start), r.end.min(chunk.end));
            if a < b {
                sample.update(&buf[(a - read) as usize..(b - read) as usize]);
            }
        }
        h.update_rayon(&buf[..n]);
        read += n as u64;
    }
    if read != size {
        // Written to while it was read: the hashes would describe no one version of the file.
        return Err(std::io::Error::other(format!(
            "{} changed size while it was read ({size} -> {read} bytes): is something still writing it?",
            path.display()
        )));
    }
    let mut id = identity_of(path, size, sample);
    id.content = Some(h.finalize().to_hex().to_string());
    Ok(id)
}

/// The identity of a model given on the command line: a GGUF file as [`file_identity`]; a
/// Hugging Face directory by its `config.json`, `tokenizer.json` and every `*.safetensors`
/// file (and shard index), in name order, so that changing any of them changes the job.
pub fn model_identity(path: &Path) -> std::io::Result<FileIdentity> {
    if !path.is_dir() {
        return sampled_identity(path);
    }
    let mut names: Vec<std::path::PathBuf> = std::fs::read_dir(path)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            p.is_file()
                && (n == "config.json"
                    || n == "tokenizer.json"
                    || n.ends_with(".safetensors")
                    || n.ends_with(".safetensors.index.json"))
        })
        .collect();
    names.sort();
    let mut h = blake3::Hasher::new();
    let mut size = 0u64;
    for p in &names {
        let id = sampled_identity(p)?;
        size += id.size;
        h.update(id.name.as_bytes());
        h.update(id.sample.as_bytes());
    }
    Ok(identity_of(path, size, h))
}

/// What makes two runs the same job. Anything that changes a row belongs here.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobFingerprint {
    pub model: FileIdentity,
    /// blake3 of the pipeline file's bytes (or of the built-in OpenAI pipeline's name).
    pub pipeline: String,
    /// Canonical JSON of the parameters that change outputs (generation, limits, overrides).
    pub params: String,
    pub inputs: Vec<FileIdentity>,
    pub shard: Option<ShardSpec>,
    /// `--incremental`: the digest of the finished output whose rows this job reuses (absent
    /// otherwise, so that other jobs' digests are as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
}

impl JobFingerprint {
    /// Hex digest of everything.
    pub fn digest(&self) -> String {
        blake3::hash(serde_json::to_string(self).unwrap_or_default().as_bytes()).to_hex().to_string()
    }

    /// Hex digest without the shard: the same for all shards of one job (checked by merge).
    pub fn job_digest(&self) -> String {
        let mut f = self.clone();
        f.shard = None;
        f.digest()
    }

    /// What differs, for the mismatch message: the parts by name, each input file that changed
    /// with its sizes (`self` is the checkpoint's, `other` this run's).
    pub fn describe_differences(&self, other: &JobFingerprint) -> String {
        let mut d: Vec<String> = Vec::new();
        for part in self.differences(other) {
            if part != "the input files" {
                d.push(part.to_string());
                continue;
            }
            let mut files = Vec::new();
            for (k, new) in other.inputs.iter().enumerate() {
                match self.inputs.get(k) {
                    Some(old) if old == new => {}
                    Some(old) if old.name == new.name => {
                        files.push(format!("{} ({} -> {} bytes, content differs)", new.name, old.size, new.size))
                    }
                    Some(old) => files.push(format!("{} in place of {}", new.name, old.name)),
                    None => files.push(format!("{} added", new.name)),
                }
            }
            for old in self.inputs.iter().skip(other.inputs.len()) {
                files.push(format!("{} no longer given", old.name));
            }
            d.push(format!("the input files ({})", files.join(", ")));
        }
        d.join(", ")
    }

    /// Names of the parts that differ, for the mismatch message.
    pub fn differences(&self, other: &JobFingerprint) -> Vec<&'static str> {
        let mut d = Vec::new();
        if self.model != other.model {
            d.push("the model");
        }
        if self.pipeline != other.pipeline {
            d.push("the pipeline file");
        }
        if self.params != other.params {
            d.push("the generation parameters");
        }
        if self.inputs != other.inputs {
            d.push("the input files");
        }
        if self.shard != other.shard {
            d.push("the shard");
        }
        if self.base != other.base {
            d.push("the finished output an --incremental run builds on");
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edit_in_the_middle_of_a_large_input_changes_its_identity() {
        let dir = std::env::temp_dir().join(format!("dustoff-fileid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big.jsonl");
        // 3 MiB: the middle MiB is outside the sample.
        let mut bytes: Vec<u8> = (0..3u32 << 20).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let before = file_identity(&path).unwrap();
        assert_eq!(before, file_identity(&path).unwrap());
        bytes[3 << 19] = b'!';
        std::fs::write(&path, &bytes).unwrap();
        let after = file_identity(&path).unwrap();
        assert_eq!((before.size, &before.sample), (after.size, &after.sample), "the sample cannot see it");
        assert_ne!(before, after, "the whole-content hash does");
        // An identity stored before `content` existed compares by size and sample: its
        // checkpoint still resumes.
        let old: FileIdentity = serde_json::from_str(
            &serde_json::json!({"name": before.name, "size": before.size, "sample": before.sample}).to_string(),
        )
        .unwrap();
        assert_eq!(old.content, None);
        assert_eq!(old, after);
        // Models keep the sample only.
        assert_eq!(model_identity(&path).unwrap().content, None);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_sample_taken_while_hashing_the_whole_file_is_the_sample_read_alone() {
        // The sample is what checkpoints written before `content` compare by: size (LE u64),
        // the first MiB, the last MiB not overlapping it. Sizes around the MiB edges and the
        // 16 MiB reads of the whole-file pass.
        let dir = std::env::temp_dir().join(format!("dustoff-sample-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("in.jsonl");
        let m = 1usize << 20;
        for size in [0, 1, m - 1, m, m + 1, 2 * m - 1, 2 * m, 2 * m + 7, 16 * m + 5, 17 * m + 3] {
            let bytes: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
            std::fs::write(&path, &bytes).unwrap();
            let mut want = blake3::Hasher::new();
            want.update(&(size as u64).to_le_bytes());
            want.update(&bytes[..m.min(size)]);
            if size > m {
                want.update(&bytes[(size - m).max(m)..]);
            }
            let want = want.finalize().to_hex().to_string();
            let whole = file_identity(&path).unwrap();
            assert_eq!(whole.sample, want, "size {size}: sample taken in the whole-file pass");
            assert_eq!(sampled_identity(&path).unwrap().sample, want, "size {size}: sample read alone");
            assert_eq!(whole.content.unwrap(), blake3::hash(&bytes).to_hex().to_string(), "size {size}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}

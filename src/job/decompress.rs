//! Compressed JSONL input (archives are often `.jsonl.gz` or `.jsonl.zst`): the format is told
//! by the file's first bytes, not its name, and the records are decompressed as they are read
//! (gzip through flate2, including concatenated members; zstd through the zstd crate,
//! including several frames). Other compressed or archive formats (bzip2, xz, zip, 7z) are
//! refused with a message naming the file, instead of being read as text (one `invalid_utf8`
//! error row per binary line).

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// How a JSONL input file is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

#[derive(Debug, thiserror::Error)]
pub enum DecompressError {
    #[error("cannot read input {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "input {path} is {format}, which dustoff does not read; decompress it first (or recompress it \
         with gzip or zstd: .gz and .zst JSONL are read directly)"
    )]
    Unsupported { path: PathBuf, format: &'static str },
}

/// Magic numbers: the formats read, then the ones refused by name.
const GZIP: &[u8] = &[0x1f, 0x8b];
const ZSTD: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];
const REFUSED: [(&[u8], &str); 5] = [
    (b"BZh", "bzip2-compressed"),
    (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz-compressed"),
    (b"PK\x03\x04", "a zip archive"),
    (&[b'7', b'z', 0xbc, 0xaf, 0x27, 0x1c], "a 7z archive"),
    (&[0x04, 0x22, 0x4d, 0x18], "lz4-compressed"),
];

/// The compression of a file's first bytes; refused formats are an error.
pub fn detect(path: &Path, head: &[u8]) -> Result<Compression, DecompressError> {
    if head.starts_with(GZIP) {
        return Ok(Compression::Gzip);
    }
    if head.starts_with(ZSTD) {
        return Ok(Compression::Zstd);
    }
    for (magic, format) in REFUSED {
        if head.starts_with(magic) {
            return Err(DecompressError::Unsupported { path: path.to_path_buf(), format });
        }
    }
    Ok(Compression::None)
}

/// The compression of a file, from its first bytes.
pub fn compression_of(path: &Path) -> Result<Compression, DecompressError> {
    let io = |source| DecompressError::Io { path: path.to_path_buf(), source };
    let mut head = Vec::with_capacity(8);
    File::open(path).map_err(io)?.take(8).read_to_end(&mut head).map_err(io)?;
    detect(path, &head)
}

/// The decompressed bytes of a JSONL input file, streamed.
pub fn open(path: &Path) -> Result<Box<dyn Read + Send>, DecompressError> {
    open_limited(path, None)
}

/// [`open`] over at most the first `limit` bytes of the file (compressed bytes for a
/// compressed file).
pub fn open_limited(path: &Path, limit: Option<u64>) -> Result<Box<dyn Read + Send>, DecompressError> {
    let io = |source| DecompressError::Io { path: path.to_path_buf(), source };
    let kind = compression_of(path)?;
    let f = File::open(path).map_err(io)?.take(limit.unwrap_or(u64::MAX));
    Ok(match kind {
        Compression::None => Box::new(f),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(BufReader::with_capacity(1 << 16, f))),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(f).map_err(io)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_numbers_decide_and_refused_formats_are_named() {
        let p = Path::new("a.jsonl");
        assert_eq!(detect(p, b"{\"id\": 1}").unwrap(), Compression::None);
        assert_eq!(detect(p, b"").unwrap(), Compression::None);
        assert_eq!(detect(p, &[0x1f, 0x8b, 8, 0]).unwrap(), Compression::Gzip);
        assert_eq!(detect(p, &[0x28, 0xb5, 0x2f, 0xfd, 0]).unwrap(), Compression::Zstd);
        for (head, name) in
            [(&b"BZh91AY"[..], "bzip2"), (&[0xfd, b'7', b'z', b'X', b'Z', 0, 0][..], "xz"), (b"PK\x03\x04", "zip")]
        {
            let e = detect(Path::new("arch/x.jsonl.bin"), head).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains("arch/x.jsonl.bin"), "{e}");
        }
    }
}

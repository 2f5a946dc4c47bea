//! Where `dustoff run NAME` finds the pipeline `NAME.toml`, so that a command written in a
//! repository also works from cron (whose current folder is `$HOME`): in order, `--pipelines
//! DIR`, the folders of `DUSTOFF_PIPELINES` (separated by `:`), `pipelines/` beside the
//! installed binary, and `pipelines/` in the current folder. A pipeline given as a path to an
//! existing file is read from there. A name found nowhere is refused listing every place looked.

use std::path::{Path, PathBuf};

/// One folder of the search path and why it is there (for the not-found message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchDir {
    pub dir: PathBuf,
    pub from: &'static str,
}

/// What `--help` says about the search (the order [`pipeline_dirs`] builds).
pub const HELP: &str = "Pipeline names are looked up, in order, in: --pipelines DIR; the folders of \
    DUSTOFF_PIPELINES (separated by ':'); pipelines/ beside the dustoff binary; pipelines/ in the \
    current folder. A path to a .toml file is read as given.";

/// The search path: `flag` (`--pipelines`), then `env` (`DUSTOFF_PIPELINES`), then the folder
/// beside `exe` (the running binary), then `cwd`'s `pipelines/`. Relative entries are made
/// absolute against `cwd`, so the message names real places; repeats are dropped.
pub fn search_dirs(
    flag: Option<&Path>,
    env: Option<&std::ffi::OsStr>,
    exe: Option<&Path>,
    cwd: &Path,
) -> Vec<SearchDir> {
    let mut dirs: Vec<SearchDir> = Vec::new();
    let mut add = |dir: PathBuf, from: &'static str| {
        let dir = if dir.is_absolute() { dir } else { cwd.join(dir) };
        if !dirs.iter().any(|d| d.dir == dir) {
            dirs.push(SearchDir { dir, from });
        }
    };
    if let Some(f) = flag {
        add(f.to_path_buf(), "--pipelines");
    }
    for d in env.map(|e| std::env::split_paths(e).collect::<Vec<_>>()).unwrap_or_default() {
        if !d.as_os_str().is_empty() {
            add(d, "DUSTOFF_PIPELINES");
        }
    }
    if let Some(bin_dir) = exe.and_then(Path::parent) {
        add(bin_dir.join("pipelines"), "beside the binary");
    }
    add(PathBuf::from("pipelines"), "current folder");
    dirs
}

/// The search path of this process (`--pipelines` as given).
pub fn pipeline_dirs(flag: Option<&Path>) -> Vec<SearchDir> {
    let exe = std::env::current_exe().ok();
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    search_dirs(flag, crate::sys::env::get_os("DUSTOFF_PIPELINES").as_deref(), exe.as_deref(), &cwd)
}

/// The file `name_or_path` names: an existing file as given, else `<dir>/<name>.toml` in the
/// first folder of `dirs` that has it. `Err`: every file looked for, in order.
pub fn find(name_or_path: &str, dirs: &[SearchDir]) -> Result<PathBuf, Vec<PathBuf>> {
    let direct = PathBuf::from(name_or_path);
    if direct.is_file() {
        return Ok(direct);
    }
    let file = if name_or_path.ends_with(".toml") { name_or_path.to_string() } else { format!("{name_or_path}.toml") };
    let mut looked = vec![direct];
    for d in dirs {
        let p = d.dir.join(&file);
        if p.is_file() {
            return Ok(p);
        }
        looked.push(p);
    }
    Err(looked)
}

/// The places of a not-found message: `path (why)`, one per line.
pub fn describe(looked: &[PathBuf], dirs: &[SearchDir]) -> String {
    let mut s = String::new();
    for (i, p) in looked.iter().enumerate() {
        let why = if i == 0 { "as a path" } else { dirs.get(i - 1).map_or("", |d| d.from) };
        s += &format!("\n  {} ({why})", p.display());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_is_flag_env_binary_cwd_and_relative_entries_become_absolute() {
        let env = std::env::join_paths(["/srv/a", "rel", "/srv/a"]).unwrap();
        let d = search_dirs(
            Some(Path::new("/etc/dustoff/pipelines")),
            Some(&env),
            Some(Path::new("/opt/dustoff/dustoff")),
            Path::new("/home/op"),
        );
        let got: Vec<(String, &str)> = d.iter().map(|s| (s.dir.display().to_string(), s.from)).collect();
        assert_eq!(
            got,
            vec![
                ("/etc/dustoff/pipelines".to_string(), "--pipelines"),
                ("/srv/a".to_string(), "DUSTOFF_PIPELINES"),
                ("/home/op/rel".to_string(), "DUSTOFF_PIPELINES"),
                ("/opt/dustoff/pipelines".to_string(), "beside the binary"),
                ("/home/op/pipelines".to_string(), "current folder"),
            ]
        );
    }

    #[test]
    fn the_first_folder_holding_the_name_wins_and_a_miss_lists_every_place() {
        let root = std::env::temp_dir().join(format!("dustoff-search-{}", std::process::id()));
        let (a, b) = (root.join("a"), root.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(b.join("sum.toml"), "x").unwrap();
        std::fs::write(a.join("sum.toml"), "x").unwrap();
        let dirs = search_dirs(Some(&b), None, None, &a);
        assert_eq!(find("sum", &dirs).unwrap(), b.join("sum.toml"), "--pipelines before the current folder");
        assert_eq!(find("sum.toml", &dirs).unwrap(), b.join("sum.toml"));
        let looked = find("nope", &dirs).unwrap_err();
        assert_eq!(looked, vec![PathBuf::from("nope"), b.join("nope.toml"), a.join("pipelines/nope.toml")]);
        let text = describe(&looked, &dirs);
        assert!(text.contains("(--pipelines)") && text.contains("(current folder)"), "{text}");
        let _ = std::fs::remove_dir_all(&root);
    }
}

//! PTX of a kernel file cut down to the entries a model launches. The driver compiles every
//! entry of a module when it loads it (from compute_70 PTX on a new GPU or driver: most of a
//! minute for all the files), and most entries of the per-format files serve block formats a
//! given model does not hold: a Q4_K_M model reads Q4_K and Q6_K, 2 of the 8.
//!
//! The text keeps its header, its module-scope declarations (`.extern .shared`, demoted
//! `.shared` variables, `.global` tables: the driver allocates a kernel's shared memory by what
//! that kernel references) and the entries `keep` accepts, byte for byte; a dropped entry loses
//! its `// .globl` line, its parameter list, its directives and its body. NVRTC's PTX of these
//! files defines no `.func` (every device function is inlined), so no kept entry can call into
//! a dropped one.

/// `ptx` without the `.entry` blocks whose name `keep` rejects.
pub fn keep_entries(ptx: &str, keep: &dyn Fn(&str) -> bool) -> String {
    let mut out = String::with_capacity(ptx.len());
    let mut dropped = std::collections::HashSet::new();
    let mut lines = ptx.split_inclusive('\n');
    while let Some(line) = lines.next() {
        match entry_name(line) {
            Some(name) if !keep(name) => {
                dropped.insert(name);
                // Skip to the line that closes the body: depth back to 0 after the first `{`.
                let (mut depth, mut opened) = (braces(line), line.contains('{'));
                while !(opened && depth == 0) {
                    let Some(l) = lines.next() else { break };
                    depth += braces(l);
                    opened |= l.contains('{');
                }
            }
            _ => out.push_str(line),
        }
    }
    // The `// .globl NAME` comments NVRTC writes for the dropped entries go with them.
    let dropped_globl = |l: &str| {
        let w: Vec<&str> = l.split_whitespace().collect();
        matches!(w.as_slice(), ["//", ".globl", n] if dropped.contains(*n))
    };
    out.split_inclusive('\n').filter(|l| !dropped_globl(l)).collect()
}

/// The entry a line declares (`.visible .entry NAME(` or `.entry NAME(` at column 0).
fn entry_name(line: &str) -> Option<&str> {
    let rest = line.strip_prefix(".visible .entry ").or_else(|| line.strip_prefix(".entry "))?;
    let name = rest.split('(').next()?.trim();
    (!name.is_empty()).then_some(name)
}

/// `{` minus `}` on a line, outside its `//` comment.
fn braces(line: &str) -> i64 {
    let code = line.split("//").next().unwrap_or("");
    code.matches('{').count() as i64 - code.matches('}').count() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "//\n// Generated\n//\n\n.version 7.0\n.target sm_70\n.address_size 64\n\n\
\t// .globl\ta_q4_0\n.extern .shared .align 16 .b8 smem[];\n.shared .align 4 .u32 s_tile;\n\n\
.visible .entry a_q4_0(\n\t.param .u64 a_q4_0_param_0\n)\n.maxntid 256, 1, 1\n{\n\t.reg .b32 \t%r<4>;\n\
\tmov.b64 \t{%r1, %r2}, %rd1;\n$L__BB0_2:\n\t{\n\t.reg .b16 %t;\n\t}\n\tret;\n\n}\n\
\t// .globl\ta_q6_k\n.visible .entry a_q6_k(\n\t.param .u64 a_q6_k_param_0\n)\n{\n\t// a comment with a brace {\n\tret;\n\n}\n\
\t// .globl\tb_f32\n.visible .entry b_f32(\n\t.param .u64 b_f32_param_0\n)\n{\n\tret;\n\n}\n";

    fn names(ptx: &str) -> Vec<&str> {
        ptx.lines().filter_map(entry_name).collect()
    }

    #[test]
    fn keeps_the_chosen_entries_byte_for_byte_and_every_declaration() {
        let out = keep_entries(PTX, &|n| n != "a_q4_0");
        assert_eq!(names(&out), ["a_q6_k", "b_f32"]);
        // Header and module-scope declarations stay; the dropped entry's globl line goes.
        assert!(out.starts_with("//\n// Generated\n//\n\n.version 7.0\n.target sm_70\n.address_size 64\n"));
        assert!(out.contains(".extern .shared .align 16 .b8 smem[];\n.shared .align 4 .u32 s_tile;\n"));
        assert!(!out.contains("a_q4_0"), "{out}");
        let tail = &PTX[PTX.find("\t// .globl\ta_q6_k").unwrap()..];
        assert!(out.ends_with(tail), "{out}");
    }

    #[test]
    fn an_entry_with_nested_blocks_and_braces_in_operands_is_cut_whole() {
        let out = keep_entries(PTX, &|n| n == "b_f32");
        assert_eq!(names(&out), ["b_f32"]);
        assert!(!out.contains("$L__BB0_2") && !out.contains("a comment"), "{out}");
        assert_eq!(out.matches('{').count(), out.matches('}').count());
    }

    #[test]
    fn keeping_everything_or_nothing() {
        assert_eq!(keep_entries(PTX, &|_| true), PTX);
        let none = keep_entries(PTX, &|_| false);
        assert!(names(&none).is_empty());
        assert!(none.contains(".address_size 64") && none.contains("s_tile"));
    }
}

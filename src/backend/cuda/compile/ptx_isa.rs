//! PTX ISA versions: which PTX features need which ISA (the tables below, from the "PTX ISA
//! Notes" of each instruction and directive in NVIDIA's PTX ISA manual), the check that a PTX
//! text uses nothing its ISA lacks, and the lowering of NVRTC's `.version` line to the oldest
//! ISA dustoff's V100 kernels need.
//!
//! Why: a driver JIT-compiles PTX no newer than itself. NVRTC 12.9 writes `.version 8.8`, which
//! only drivers of CUDA 12.9+ load, although the compute_70 kernels use nothing newer than ISA
//! 6.4. [`lower`] rewrites the version line to [`V100_ISA`] (CUDA 11.0's ISA), after removing
//! the few optimization hints that a newer ISA allows and an older one refuses (NVRTC 12.9's
//! `.pragma "used_bytes_mask N"`: CUDA 12.9's and 13.0's ptxas reject it below ISA 8.3, which
//! is why a relabelled file failed to load on a CUDA 13 driver). Then [`check`] reads every
//! instruction, directive, pragma and special register: one that the tables do not know is an
//! error (so a new NVRTC cannot slip in an unchecked feature), and one that needs a newer ISA
//! than declared is an error naming it, its line and its ISA. CI assembles the result with
//! CUDA 11.8's and 12.9's ptxas (scripts/ptxas-check.sh), which holds the tables honest.

use std::collections::BTreeSet;
use std::fmt;

/// A PTX ISA version (`.version MAJOR.MINOR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Isa(pub u32, pub u32);

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// The ISA the compute_70 PTX declares: CUDA 11.0's, so every driver from CUDA 11.0 up JITs it
/// (the kernels need no more than 6.4: `wmma ... .aligned` 6.3, `mma.m8n8k4` 6.4; sm_70 itself
/// needs 6.0).
pub const V100_ISA: Isa = Isa(7, 0);

/// Names what [`lower`] does, for the kernel cache key: change it when the lowering changes.
pub const LOWERING_ID: &str = "ptx-isa-lower v1 (drop used_bytes_mask; .version rewrite; checked)";

/// The PTX ISA a CUDA release writes and its driver JIT-compiles (the PTX ISA manual's release
/// history: CUDA 11.x -> 7.x, 12.0-12.5 -> 8.0-8.5, 12.6 -> 8.5, 12.7/12.8 -> 8.7, 12.9 -> 8.8,
/// 13.x -> 9.x).
pub fn isa_of_cuda(cuda: (i32, i32)) -> Isa {
    let m = cuda.1.max(0) as u32;
    match cuda {
        (11, _) => Isa(7, m.min(8)),
        (12, 0..=5) => Isa(8, m),
        (12, 6) => Isa(8, 5),
        (12, 7 | 8) => Isa(8, 7),
        (12, _) => Isa(8, 8),
        (13, _) => Isa(9, m),
        (major, _) if major > 13 => Isa(major as u32 - 4, 0),
        _ => Isa(6, 0),
    }
}

/// An instruction rule: the opcode's first part and the parts it must also have (any order),
/// e.g. `("wmma", &["aligned"])` for every `wmma.*.aligned.*`. `"*"` matches every opcode.
struct Rule(&'static str, &'static [&'static str], Isa);

const fn v(major: u32, minor: u32) -> Isa {
    Isa(major, minor)
}

/// Every instruction the kernels use and the newer ones they must not (an opcode's ISA is the
/// largest of its matching rules; one with no plain rule for its first part is unknown).
#[rustfmt::skip]
const INSTRUCTIONS: &[Rule] = &[
    // Since PTX 1.x.
    Rule("add", &[], v(1, 0)), Rule("sub", &[], v(1, 0)), Rule("mul", &[], v(1, 0)),
    Rule("mad", &[], v(1, 0)), Rule("div", &[], v(1, 0)), Rule("rem", &[], v(1, 0)),
    Rule("abs", &[], v(1, 0)), Rule("neg", &[], v(1, 0)), Rule("min", &[], v(1, 0)),
    Rule("max", &[], v(1, 0)), Rule("set", &[], v(1, 0)), Rule("setp", &[], v(1, 0)),
    Rule("selp", &[], v(1, 0)), Rule("slct", &[], v(1, 0)), Rule("and", &[], v(1, 0)),
    Rule("or", &[], v(1, 0)), Rule("xor", &[], v(1, 0)), Rule("not", &[], v(1, 0)),
    Rule("cnot", &[], v(1, 0)), Rule("shl", &[], v(1, 0)), Rule("shr", &[], v(1, 0)),
    Rule("mov", &[], v(1, 0)), Rule("ld", &[], v(1, 0)), Rule("st", &[], v(1, 0)),
    Rule("cvt", &[], v(1, 0)), Rule("bra", &[], v(1, 0)), Rule("call", &[], v(1, 0)),
    Rule("ret", &[], v(1, 0)), Rule("exit", &[], v(1, 0)), Rule("trap", &[], v(1, 0)),
    Rule("rcp", &[], v(1, 0)), Rule("sqrt", &[], v(1, 0)), Rule("rsqrt", &[], v(1, 0)),
    Rule("sin", &[], v(1, 0)), Rule("cos", &[], v(1, 0)), Rule("lg2", &[], v(1, 0)),
    Rule("ex2", &[], v(1, 0)), Rule("mul24", &[], v(1, 0)), Rule("mad24", &[], v(1, 0)),
    Rule("sad", &[], v(1, 0)), Rule("bar", &[], v(1, 0)), Rule("atom", &[], v(1, 1)),
    Rule("red", &[], v(1, 2)), Rule("vote", &[], v(1, 2)), Rule("membar", &[], v(1, 4)),
    // PTX 2.x-5.x.
    Rule("fma", &[], v(2, 0)), Rule("popc", &[], v(2, 0)), Rule("clz", &[], v(2, 0)),
    Rule("bfind", &[], v(2, 0)), Rule("brev", &[], v(2, 0)), Rule("bfe", &[], v(2, 0)),
    Rule("bfi", &[], v(2, 0)), Rule("prmt", &[], v(2, 0)), Rule("testp", &[], v(2, 0)),
    Rule("copysign", &[], v(2, 0)), Rule("cvta", &[], v(2, 0)), Rule("isspacep", &[], v(2, 0)),
    Rule("prefetch", &[], v(2, 0)), Rule("prefetchu", &[], v(2, 0)), Rule("ldu", &[], v(2, 0)),
    Rule("bar", &["arrive"], v(2, 0)), Rule("bar", &["red"], v(2, 0)),
    Rule("shfl", &[], v(3, 0)), Rule("shf", &[], v(3, 1)), Rule("ld", &["nc"], v(3, 1)),
    Rule("lop3", &[], v(4, 3)), Rule("dp4a", &[], v(5, 0)), Rule("dp2a", &[], v(5, 0)),
    // Half precision arithmetic (f16 4.2; neg 6.0, abs 6.5, min/max 7.0).
    Rule("add", &["f16"], v(4, 2)), Rule("add", &["f16x2"], v(4, 2)),
    Rule("sub", &["f16"], v(4, 2)), Rule("sub", &["f16x2"], v(4, 2)),
    Rule("mul", &["f16"], v(4, 2)), Rule("mul", &["f16x2"], v(4, 2)),
    Rule("fma", &["f16"], v(4, 2)), Rule("fma", &["f16x2"], v(4, 2)),
    Rule("neg", &["f16"], v(6, 0)), Rule("neg", &["f16x2"], v(6, 0)),
    Rule("abs", &["f16"], v(6, 5)), Rule("abs", &["f16x2"], v(6, 5)),
    Rule("min", &["f16"], v(7, 0)), Rule("min", &["f16x2"], v(7, 0)),
    Rule("max", &["f16"], v(7, 0)), Rule("max", &["f16x2"], v(7, 0)),
    // PTX 6.x: the Volta generation (warp-synchronous forms, tensor cores).
    Rule("shfl", &["sync"], v(6, 0)), Rule("vote", &["sync"], v(6, 0)),
    Rule("bar", &["warp"], v(6, 0)), Rule("barrier", &[], v(6, 0)), Rule("match", &[], v(6, 0)),
    Rule("fns", &[], v(6, 0)), Rule("fence", &[], v(6, 0)), Rule("brx", &[], v(6, 0)),
    Rule("wmma", &[], v(6, 0)), Rule("wmma", &["aligned"], v(6, 3)),
    Rule("activemask", &[], v(6, 2)), Rule("nanosleep", &[], v(6, 3)),
    Rule("mma", &[], v(6, 4)), Rule("mma", &["m16n8k8"], v(6, 5)), Rule("mma", &["m16n8k16"], v(7, 0)),
    Rule("ldmatrix", &[], v(6, 5)),
    // Memory-model qualifiers (6.0).
    Rule("ld", &["relaxed"], v(6, 0)), Rule("ld", &["acquire"], v(6, 0)),
    Rule("st", &["relaxed"], v(6, 0)), Rule("st", &["release"], v(6, 0)),
    Rule("atom", &["relaxed"], v(6, 0)), Rule("atom", &["acquire"], v(6, 0)),
    Rule("atom", &["release"], v(6, 0)), Rule("atom", &["acq_rel"], v(6, 0)),
    Rule("atom", &["noftz"], v(6, 3)),
    // PTX 7.x and later: Ampere and newer (the sm_70 check refuses most of them anyway).
    Rule("cvt", &["f16x2"], v(7, 0)), Rule("cvt", &["relu"], v(7, 0)), Rule("cvt", &["satfinite"], v(8, 1)),
    Rule("redux", &[], v(7, 0)), Rule("cp", &[], v(7, 0)), Rule("cp", &["bulk"], v(8, 0)),
    Rule("mbarrier", &[], v(7, 0)), Rule("tanh", &[], v(7, 0)),
    Rule("discard", &[], v(7, 4)), Rule("createpolicy", &[], v(7, 4)), Rule("applypriority", &[], v(7, 4)),
    Rule("szext", &[], v(7, 6)), Rule("bmsk", &[], v(7, 6)),
    Rule("mapa", &[], v(7, 8)), Rule("stmatrix", &[], v(7, 8)), Rule("griddepcontrol", &[], v(7, 8)),
    Rule("elect", &[], v(8, 0)), Rule("wgmma", &[], v(8, 0)), Rule("setmaxnreg", &[], v(8, 0)),
    Rule("st", &["async"], v(8, 1)), Rule("tensormap", &[], v(8, 3)),
    // Types and qualifiers on any instruction.
    Rule("*", &["bf16"], v(7, 0)), Rule("*", &["bf16x2"], v(7, 0)), Rule("*", &["tf32"], v(7, 0)),
    Rule("*", &["e4m3"], v(7, 8)), Rule("*", &["e5m2"], v(7, 8)), Rule("*", &["b128"], v(8, 3)),
    Rule("*", &["v8"], v(8, 8)),
    Rule("*", &["L1::evict_normal"], v(7, 4)), Rule("*", &["L1::evict_first"], v(7, 4)),
    Rule("*", &["L1::evict_last"], v(7, 4)), Rule("*", &["L1::no_allocate"], v(7, 4)),
    Rule("*", &["L2::64B"], v(7, 4)), Rule("*", &["L2::128B"], v(7, 4)), Rule("*", &["L2::256B"], v(7, 4)),
    Rule("*", &["L2::cache_hint"], v(7, 4)),
];

/// Directive and type words (`.entry`, `.reg`, `.b32`, ...) and the ISA that introduced each.
#[rustfmt::skip]
const DIRECTIVES: &[(&str, Isa)] = &[
    (".version", v(1, 0)), (".target", v(1, 0)), (".address_size", v(2, 3)),
    (".entry", v(1, 0)), (".func", v(1, 0)), (".visible", v(1, 0)), (".extern", v(1, 0)),
    (".weak", v(3, 1)), (".common", v(5, 0)), (".param", v(1, 0)), (".reg", v(1, 0)),
    (".shared", v(1, 0)), (".global", v(1, 0)), (".const", v(1, 0)), (".local", v(1, 0)),
    (".align", v(1, 0)), (".ptr", v(2, 2)), (".maxntid", v(1, 3)), (".maxnreg", v(1, 3)),
    (".reqntid", v(2, 1)), (".minnctapersm", v(2, 0)), (".pragma", v(2, 0)), (".file", v(1, 0)),
    (".loc", v(1, 0)), (".section", v(2, 0)), (".callprototype", v(2, 1)), (".noreturn", v(6, 4)),
    (".alias", v(6, 3)), (".explicitcluster", v(7, 8)), (".reqnctapercluster", v(7, 8)),
    (".maxclusterrank", v(7, 8)), (".attribute", v(8, 0)),
    (".b8", v(1, 0)), (".b16", v(1, 0)), (".b32", v(1, 0)), (".b64", v(1, 0)),
    (".u8", v(1, 0)), (".u16", v(1, 0)), (".u32", v(1, 0)), (".u64", v(1, 0)),
    (".s8", v(1, 0)), (".s16", v(1, 0)), (".s32", v(1, 0)), (".s64", v(1, 0)),
    (".f32", v(1, 0)), (".f64", v(1, 0)), (".pred", v(1, 0)), (".f16", v(4, 2)), (".f16x2", v(4, 2)),
    (".v2", v(1, 0)), (".v4", v(1, 0)), (".b128", v(8, 3)), (".bf16", v(7, 0)), (".bf16x2", v(7, 0)),
];

/// Pragma strings: the ISA that introduced each, and whether it is a pure optimization hint that
/// [`lower`] may drop (the program means the same without it).
#[rustfmt::skip]
const PRAGMAS: &[(&str, Isa, bool)] = &[
    ("nounroll", v(2, 0), false),
    // "Only these bytes of the load's result are used": dropping it makes ptxas keep all of them.
    ("used_bytes_mask", v(8, 3), true),
    ("enable_smem_spilling", v(9, 0), false),
];

/// Special registers (`%tid.x`, ...) and their ISA.
#[rustfmt::skip]
const SPECIAL_REGISTERS: &[(&str, Isa)] = &[
    ("tid", v(1, 0)), ("ntid", v(1, 0)), ("ctaid", v(1, 0)), ("nctaid", v(1, 0)),
    ("laneid", v(1, 3)), ("warpid", v(1, 3)), ("nwarpid", v(2, 0)), ("smid", v(1, 3)),
    ("nsmid", v(2, 0)), ("gridid", v(1, 3)), ("clock", v(1, 0)), ("clock64", v(2, 0)),
    ("lanemask_eq", v(2, 0)), ("lanemask_le", v(2, 0)), ("lanemask_lt", v(2, 0)),
    ("lanemask_ge", v(2, 0)), ("lanemask_gt", v(2, 0)), ("globaltimer", v(3, 1)),
    ("dynamic_smem_size", v(4, 1)), ("total_smem_size", v(4, 1)),
    ("clusterid", v(7, 8)), ("cluster_ctaid", v(7, 8)), ("cluster_nctaid", v(7, 8)),
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IsaError {
    #[error("the PTX has no `.version X.Y` line")]
    NoVersion,
    #[error("PTX line {line}: `{what}` is not in dustoff's PTX ISA table (src/backend/cuda/compile/ptx_isa.rs); add it with the ISA that introduced it (PTX ISA manual, \"PTX ISA Notes\")")]
    Unknown { line: usize, what: String },
    #[error("PTX line {line}: `{what}` needs PTX ISA {needs}, but the PTX is to declare {declared}")]
    TooNew { line: usize, what: String, needs: Isa, declared: Isa },
}

/// The `.version` a PTX text declares.
pub fn declared(ptx: &str) -> Result<Isa, IsaError> {
    ptx.lines().find_map(|l| parse_version(l.trim())).ok_or(IsaError::NoVersion)
}

fn parse_version(line: &str) -> Option<Isa> {
    let (a, b) = line.strip_prefix(".version")?.trim().split_once('.')?;
    Some(Isa(a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// One feature of a PTX text and the ISA it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Feature {
    pub line: usize,
    pub what: String,
    pub needs: Isa,
}

/// The statements of a line: comments cut, split at `;`, inline-asm braces trimmed.
fn statements(line: &str) -> impl Iterator<Item = &str> {
    let code = line.split("//").next().unwrap_or("");
    code.split(';').map(|s| s.trim().trim_start_matches('{').trim_end_matches('}').trim()).filter(|s| !s.is_empty())
}

fn instruction_isa(op: &str) -> Option<Isa> {
    let mut parts = op.split('.');
    let base = parts.next()?;
    let mods: Vec<&str> = parts.collect();
    let mut known = false;
    let mut isa = Isa(1, 0);
    for Rule(b, need, at) in INSTRUCTIONS {
        if (*b == base || *b == "*") && need.iter().all(|m| mods.contains(m)) {
            known |= *b == base && need.is_empty();
            isa = isa.max(*at);
        }
    }
    // A `::` qualifier (cache policy) is known only through a rule that names it.
    let unnamed_policy = mods
        .iter()
        .any(|m| m.contains("::") && !INSTRUCTIONS.iter().any(|Rule(b, need, _)| *b == "*" && need.contains(m)));
    (known && !unnamed_policy).then_some(isa)
}

/// Every feature of `ptx` with the ISA it needs; an unknown one is an error.
pub fn features(ptx: &str) -> Result<Vec<Feature>, IsaError> {
    // Register names the text declares (`.reg .b32 %r<12>;` -> `r`): other `%names` are
    // special registers.
    let mut declared_regs = BTreeSet::new();
    for l in ptx.lines() {
        for s in statements(l).filter(|s| s.starts_with(".reg")) {
            for name in s.split(|c: char| c.is_whitespace() || c == ',').filter_map(|w| w.strip_prefix('%')) {
                declared_regs.insert(name.split('<').next().unwrap_or(name).to_string());
            }
        }
    }
    let mut out = Vec::new();
    for (i, l) in ptx.lines().enumerate() {
        let line = i + 1;
        for s in statements(l) {
            if s.ends_with(':') && !s.contains(char::is_whitespace) {
                continue; // a label
            }
            if let Some(p) = s.strip_prefix(".pragma") {
                let name = p.trim().trim_matches('"');
                let key = name.split_whitespace().next().unwrap_or("");
                let (_, isa, _) = PRAGMAS
                    .iter()
                    .find(|(n, _, _)| *n == key)
                    .ok_or_else(|| IsaError::Unknown { line, what: format!(".pragma \"{name}\"") })?;
                out.push(Feature { line, what: format!(".pragma \"{key}\""), needs: *isa });
                continue;
            }
            if s.starts_with('.') || s.starts_with(')') || s.starts_with('(') {
                for w in s.split(|c: char| c.is_whitespace() || "(),[]".contains(c)).filter(|w| w.starts_with('.')) {
                    let (_, isa) = DIRECTIVES
                        .iter()
                        .find(|(d, _)| *d == w)
                        .ok_or_else(|| IsaError::Unknown { line, what: w.to_string() })?;
                    out.push(Feature { line, what: w.to_string(), needs: *isa });
                }
                continue;
            }
            // An instruction: `[@[!]%p] opcode operands`.
            let body = match s.strip_prefix('@') {
                Some(rest) => rest.split_once(char::is_whitespace).map_or("", |(_, b)| b.trim_start()),
                None => s,
            };
            let op = body.split(|c: char| c.is_whitespace()).next().unwrap_or("");
            if op.is_empty() {
                continue;
            }
            let isa = instruction_isa(op).ok_or_else(|| IsaError::Unknown { line, what: op.to_string() })?;
            out.push(Feature { line, what: op.to_string(), needs: isa });
            for reg in body[op.len()..].split('%').skip(1) {
                let name: String = reg.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                let base = name.trim_end_matches(|c: char| c.is_ascii_digit());
                if name.is_empty() || declared_regs.contains(base) || declared_regs.contains(&name) {
                    continue;
                }
                // `%0`-style operands only appear inside inline asm templates, not in NVRTC output.
                let (_, isa) = SPECIAL_REGISTERS
                    .iter()
                    .find(|(r, _)| *r == name)
                    .ok_or_else(|| IsaError::Unknown { line, what: format!("%{name}") })?;
                out.push(Feature { line, what: format!("%{name}"), needs: *isa });
            }
        }
    }
    Ok(out)
}

/// The oldest ISA `ptx`'s features allow (at least 1.0).
pub fn needed(ptx: &str) -> Result<Isa, IsaError> {
    Ok(features(ptx)?.iter().map(|f| f.needs).max().unwrap_or(Isa(1, 0)))
}

/// Fails when `ptx` uses a feature newer than `isa` (or one the tables do not know).
pub fn check(ptx: &str, isa: Isa) -> Result<(), IsaError> {
    match features(ptx)?.into_iter().find(|f| f.needs > isa) {
        Some(f) => Err(IsaError::TooNew { line: f.line, what: f.what, needs: f.needs, declared: isa }),
        None => Ok(()),
    }
}

/// `ptx` declaring `to`: hints newer than `to` removed, the `.version` line rewritten, the result
/// checked. PTX already at `to` or older is returned unchanged (after the same check).
pub fn lower(ptx: &str, to: Isa) -> Result<String, IsaError> {
    let from = declared(ptx)?;
    if from <= to {
        check(ptx, from)?;
        return Ok(ptx.to_string());
    }
    let droppable = |l: &str| {
        let Some(p) = l.trim().strip_prefix(".pragma") else { return false };
        let key = p.trim().trim_start_matches('"').split(|c: char| c.is_whitespace() || c == '"').next();
        PRAGMAS.iter().any(|(n, isa, hint)| Some(*n) == key && *hint && *isa > to)
    };
    let mut out = String::with_capacity(ptx.len());
    for l in ptx.lines() {
        if droppable(l) {
            continue;
        }
        if parse_version(l.trim()).is_some() {
            out.push_str(&format!(".version {to}"));
        } else {
            out.push_str(l);
        }
        out.push('\n');
    }
    check(&out, to)?;
    Ok(out)
}

/// The ISA the PTX of `arch` is lowered to (`ptx_isa::lower`): compute_70's declares the V100
/// ISA whatever NVRTC wrote, so one PTX folder loads on every driver from CUDA 11.0 up. Other
/// architectures keep NVRTC's ISA (the NVRTC is chosen to suit the driver).
pub fn lowered_isa(arch: &str) -> Option<Isa> {
    (arch == "compute_70").then_some(V100_ISA)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = ".version 8.8\n.target sm_70\n.address_size 64\n";

    fn kernel(body: &str) -> String {
        format!(
            "{HEAD}\n\t// .globl\tk\n.visible .entry k(\n\t.param .u64 .ptr .align 1 k_param_0\n)\n.maxntid 256, 1, 1\n{{\n\t.reg .pred \t%p<3>;\n\t.reg .b32 \t%r<9>;\n\t.reg .b64 \t%rd<4>;\n\n{body}\n\tret;\n\n}}\n"
        )
    }

    #[test]
    fn version_lines_parse_and_cuda_releases_map_to_their_isa() {
        assert_eq!(declared(HEAD), Ok(Isa(8, 8)));
        assert_eq!(declared(".target sm_70\n"), Err(IsaError::NoVersion));
        assert_eq!(isa_of_cuda((11, 8)), Isa(7, 8));
        assert_eq!(isa_of_cuda((11, 0)), Isa(7, 0));
        assert_eq!(isa_of_cuda((12, 2)), Isa(8, 2));
        assert_eq!(isa_of_cuda((12, 8)), Isa(8, 7));
        assert_eq!(isa_of_cuda((12, 9)), Isa(8, 8));
        assert_eq!(isa_of_cuda((13, 0)), Isa(9, 0));
    }

    #[test]
    fn lowering_drops_the_byte_mask_hint_and_rewrites_the_version() {
        let src = kernel(
            "\tmov.u32 \t%r1, %tid.x;\n\t.pragma \"used_bytes_mask 240\";\n\tld.param.v2.u32 \t{%r2, %r3}, [%rd1+28];\n\t.pragma \"nounroll\";\n$L__BB0_1:\n\t@%p1 bra \t$L__BB0_1;\n\tshfl.sync.bfly.b32\t%r4|%p2, %r3, 16, 31, -1;",
        );
        assert_eq!(needed(&src), Ok(Isa(8, 3)), "the hint is the newest feature");
        let low = lower(&src, V100_ISA).unwrap();
        assert_eq!(declared(&low), Ok(V100_ISA));
        assert!(!low.contains("used_bytes_mask") && low.contains(".pragma \"nounroll\""), "{low}");
        assert_eq!(needed(&low), Ok(Isa(6, 0)), "shfl.sync is the newest left");
        assert_eq!(low.lines().count(), src.lines().count() - 1, "only the hint's line went");
        // Already old enough: unchanged.
        assert_eq!(lower(&low, Isa(7, 8)).unwrap(), low);
    }

    #[test]
    fn a_feature_newer_than_the_target_is_refused_by_name_and_line() {
        // bf16 is ISA 7.0 (allowed here; the sm_70 check of nvrtc.rs refuses it for the V100).
        assert_eq!(needed(&kernel("\tcvt.rn.bf16.f32 \t%r1, %r2;")), Ok(Isa(7, 0)));
        for (body, what, needs) in [
            ("\tld.global.L2::128B.v4.u32 \t{%r1, %r2, %r3, %r4}, [%rd1];", "ld.global.L2::128B.v4.u32", Isa(7, 4)),
            ("\tszext.wrap.u32 \t%r1, %r2, %r3;", "szext.wrap.u32", Isa(7, 6)),
            ("\t.pragma \"enable_smem_spilling\";", ".pragma \"enable_smem_spilling\"", Isa(9, 0)),
            ("\tmov.u32 \t%r1, %clusterid.x;", "%clusterid", Isa(7, 8)),
        ] {
            let err = lower(&kernel(body), V100_ISA).unwrap_err();
            assert_eq!(err, IsaError::TooNew { line: 15, what: what.into(), needs, declared: V100_ISA }, "{body}");
            assert!(err.to_string().contains(&format!("needs PTX ISA {needs}")), "{err}");
        }
    }

    #[test]
    fn unknown_instructions_pragmas_policies_and_registers_are_errors() {
        for (body, what) in [
            ("\tfrobnicate.b32 \t%r1, %r2;", "frobnicate.b32"),
            ("\t.pragma \"make_it_fast\";", ".pragma \"make_it_fast\""),
            ("\tld.global.L1::new_policy.u32 \t%r1, [%rd1];", "ld.global.L1::new_policy.u32"),
            ("\tmov.u32 \t%r1, %mystery_reg;", "%mystery_reg"),
            ("\t.newdirective 4;", ".newdirective"),
        ] {
            assert_eq!(
                lower(&kernel(body), V100_ISA),
                Err(IsaError::Unknown { line: 15, what: what.into() }),
                "{body}"
            );
        }
    }

    #[test]
    fn volta_features_have_their_documented_isa() {
        let isa = |op: &str| instruction_isa(op).unwrap();
        assert_eq!(isa("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32"), Isa(6, 3));
        assert_eq!(isa("wmma.load.a.sync.row.m16n16k16.f16"), Isa(6, 0));
        assert_eq!(isa("mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32"), Isa(6, 4));
        assert_eq!(isa("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"), Isa(7, 0));
        assert_eq!(isa("dp4a.s32.s32"), Isa(5, 0));
        assert_eq!(isa("ld.global.nc.v4.u32"), Isa(3, 1));
        assert_eq!(isa("vote.sync.any.pred"), Isa(6, 0));
        assert_eq!(isa("match.any.sync.b32"), Isa(6, 0));
        assert_eq!(isa("bar.warp.sync"), Isa(6, 0));
        assert_eq!(isa("cvt.rn.f16x2.f32"), Isa(7, 0));
        assert_eq!(isa("cvt.rn.f16.f32"), Isa(1, 0));
        assert_eq!(isa("ld.global.v8.f32"), Isa(8, 8));
    }
}

//! An optional observer of the matrix inputs of the CPU forward pass: calibration (the
//! importance matrix of `dustoff quantize`) and `dustoff eval` (the output head's input of every
//! token, for logits at every position) read activations through it. Without a tap the forward
//! pass does no extra work.

use std::any::Any;

pub trait ActivationTap: Send {
    /// `x` (`[n_tok, cols]`, f32) is the input of every matrix named in `names` (Q/K/V share
    /// one, gate/up share one). The output head's input is reported for every token of the step
    /// (final RMSNorm applied), not only for the tokens whose logits the step returns.
    fn matmul_input(&mut self, names: &[&str], x: &[f32], n_tok: usize);
    /// For taking the concrete tap back out of the backend.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

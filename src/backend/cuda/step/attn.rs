//! The attention of one step as the layers launch it: `AttnIo` (where the step's attention
//! reads its tables and writes its partials) over the attention numbers of the flattened step
//! (`FlatAttn`), shared by the plain layers and the hybrid models' attention layers.

use cudarc::driver::CudaStream;

use super::flat::Flat;
use crate::backend::cuda::compile::kernels::Kernels;
use crate::backend::cuda::ops as l;
use crate::backend::cuda::ops::launch::Dev;
use crate::backend::cuda::ops::prefill::{PrefillAttention, PrefillSplit};
use crate::backend::cuda::CudaError;

/// Where the step's attention reads its tables and writes its partials: everything but the
/// layer's Q and K/V, shared by the plain layers and the hybrid models' attention layers.
#[derive(Clone, Copy)]
pub(in crate::backend::cuda) struct AttnIo {
    pub f: FlatAttn,
    pub meta: Dev<i32>,
    pub kv_begin: usize,
    pub casc_tiles: usize,
    pub casc_rows: usize,
    pub tiles: usize,
    pub tile_rows: usize,
    pub part_o: Dev<f32>,
    pub part_ml: Dev<f32>,
}

/// The attention numbers of [`Flat`] (Copy, so a layer can hold them).
#[derive(Clone, Copy)]
pub(in crate::backend::cuda) struct FlatAttn {
    n_tok: usize,
    n_single: usize,
    max_len: usize,
    splits: usize,
    split_len: usize,
    n_tiles: usize,
    pf_splits: usize,
    pf_split_len: usize,
    casc_tiles: usize,
    casc_rows: usize,
    casc_splits: usize,
    casc_split_len: usize,
}

impl FlatAttn {
    pub(in crate::backend::cuda) fn of(f: &Flat) -> Self {
        FlatAttn {
            n_tok: f.n_tok,
            n_single: f.n_single,
            max_len: f.max_len,
            splits: f.splits,
            split_len: f.split_len,
            n_tiles: f.n_tiles,
            pf_splits: f.pf_splits,
            pf_split_len: f.pf_split_len,
            casc_tiles: f.casc_tiles,
            casc_rows: f.casc_rows,
            casc_splits: f.casc_splits,
            casc_split_len: f.casc_split_len,
        }
    }

    fn dec_parts(&self) -> usize {
        self.splits + self.casc_splits
    }
}

impl AttnIo {
    /// Decode tokens through the split kernel (with the shared-prefix pass where the step has
    /// groups), then the prefill tiles; `paged` names the layer's Q, caches and output.
    pub fn launch(
        &self,
        k: &mut Kernels,
        s: &CudaStream,
        paged: l::PagedAttn,
        mark: &mut dyn FnMut(&'static str) -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        let (f, meta, n, hd) = (&self.f, self.meta, self.f.n_tok, paged.head_dim);
        let n_heads = paged.n_heads;
        let lay = self;
        let (part_o, part_ml) = (self.part_o, self.part_ml);
        if f.n_single > 0 {
            // The one-token chunks come first in the step (see `Flat`).
            let paged = l::PagedAttn { n_tok: f.n_single, ..paged };
            let prefix = (f.casc_tiles > 0).then(|| l::SharedPrefix {
                kv_begin: meta.offset(lay.kv_begin),
                attn: PrefillAttention {
                    paged,
                    tiles: meta.offset(lay.casc_tiles),
                    rows: meta.offset(lay.casc_rows),
                    n_rows: f.casc_rows,
                    n_tiles: f.casc_tiles,
                    split: Some(PrefillSplit {
                        part_o,
                        part_ml,
                        split_len: f.casc_split_len,
                        n_splits: f.casc_splits,
                        n_parts: f.dec_parts(),
                        part0: f.splits,
                        tok0: 0,
                        n_part_tok: f.n_single,
                        merge: false,
                    }),
                },
            });
            l::Attention {
                paged,
                part_o,
                part_ml,
                max_len: f.max_len,
                n_splits: f.splits,
                split_len: f.split_len,
                kernel: None,
                prefix,
            }
            .launch(k, s)?;
            mark("attention split")?;
        }
        // The prefill tokens' partials follow the decode tokens'.
        let dec = f.n_single * f.dec_parts() * n_heads;
        let split = (f.pf_splits > 1).then_some(PrefillSplit {
            part_o: part_o.offset(dec * hd),
            part_ml: part_ml.offset(dec * 2),
            split_len: f.pf_split_len,
            n_splits: f.pf_splits,
            n_parts: f.pf_splits,
            part0: 0,
            tok0: f.n_single,
            n_part_tok: n - f.n_single,
            merge: true,
        });
        let (tiles, rows) = (meta.offset(lay.tiles), meta.offset(lay.tile_rows));
        PrefillAttention { paged, tiles, rows, n_rows: n - f.n_single, n_tiles: f.n_tiles, split }.launch(k, s)?;
        if f.n_tiles > 0 {
            mark("attention prefill")?;
        }
        Ok(())
    }
}

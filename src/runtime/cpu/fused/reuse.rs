//! Buffer reuse: an f32 output written into the buffer of a dead input that nothing
//! else holds (or into the variable it is the new value of, when the run may overwrite it).

use crate::base::value::Value;
use crate::compile::fuse::Group;
use crate::runtime::cpu::InPlace;
use ndarray::IxDyn;

/// A buffer for output slot `o` of `g` taken from a dead input that nothing else holds
/// (`reusable`, not yet `reused`): the variable `o` is the new value of first, when `in_place`
/// lets the run overwrite it, then the others in order.
pub(super) fn reusable_buffer(
    g: &Group,
    reusable: &[usize],
    reused: &mut [bool],
    o: usize,
    slots: &mut [Option<Value>],
    in_place: Option<&InPlace>,
) -> Option<ndarray::Array<f32, IxDyn>> {
    let own = in_place.and_then(|l| l.variable_slot[o]);
    let first = reusable.iter().position(|&e| Some(g.ext[e]) == own);
    for s in first
        .into_iter()
        .chain((0..reusable.len()).filter(|&s| Some(s) != first))
    {
        let j = g.ext[reusable[s]];
        if reused[s] || !matches!(&slots[j], Some(Value::F32(a)) if a.is_standard_layout()) {
            continue;
        }
        let buf = match in_place.and_then(|l| l.cells[j].as_ref()) {
            Some(cell) => cell.take_for_update(&mut slots[j]),
            None => {
                let Some(Value::F32(a)) = slots[j].take() else {
                    unreachable!("checked f32")
                };
                a.try_into_owned_nocopy()
                    .map_err(|a| slots[j] = Some(Value::F32(a)))
                    .ok()
            }
        };
        if buf.is_some() {
            reused[s] = true;
            return buf;
        }
    }
    None
}

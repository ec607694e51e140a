//! Stand-in for `runtime/gpu` in builds without the `gpu` feature: no adapters, and
//! every attempt to open one is a typed error. Keeps `cfg` out of the rest of the code.

use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::value::Value;
use crate::compile::Plan;
use crate::ops::source::DeviceCopy;
use crate::runtime::{Out, RunStats};
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct AdapterDesc {
    pub index: usize,
    pub name: String,
    pub backend: String,
    pub kind: String,
    pub software: bool,
}

/// Never constructed: there is no GPU context in this build.
pub enum Context {}

impl Context {
    pub fn index(&self) -> usize {
        match *self {}
    }
}

/// A device-resident variable value; uninhabited in this build.
#[derive(Clone)]
pub enum Resident {}

impl Resident {
    pub fn shape(&self) -> &[usize] {
        match *self {}
    }
    pub fn dtype(&self) -> DType {
        match *self {}
    }
    pub fn download(&self) -> Result<Value> {
        match *self {}
    }
}

impl DeviceCopy for Resident {
    fn device_id(&self) -> u64 {
        match *self {}
    }
    fn download(&self) -> Result<Value> {
        match *self {}
    }
    fn as_any(&self) -> &dyn std::any::Any {
        match *self {}
    }
}

/// Per-plan GPU state; empty in this build.
#[derive(Default)]
pub struct PlanCache;

pub fn adapters() -> Vec<AdapterDesc> {
    vec![]
}

pub fn why_none() -> String {
    "this build of ferrokeras has no GPU support (the `gpu` cargo feature is off)".into()
}

pub fn open(_index: usize) -> Result<Arc<Context>> {
    Err(Error::Device(why_none()))
}

pub fn run(
    ctx: &Arc<Context>,
    _plan: &Plan,
    _feeds: Vec<Value>,
    _n_host: usize,
    _cache: &PlanCache,
) -> Result<(Vec<Out>, RunStats)> {
    match **ctx {}
}

pub fn stats(ctx: &Context) -> (u64, u64, usize) {
    match *ctx {}
}

pub fn compile_wgsl(ctx: &Arc<Context>, _src: &str, _entry: &str) -> Result<()> {
    match **ctx {}
}

pub fn pool_stats(ctx: &Context) -> Vec<(&'static str, u64)> {
    match *ctx {}
}

pub fn pool_limits(ctx: &Context, _max_idle_bytes: Option<u64>, _max_idle_submits: Option<u64>) {
    match *ctx {}
}

pub fn pool_clear() {}

pub fn lose(ctx: &Context) {
    match *ctx {}
}

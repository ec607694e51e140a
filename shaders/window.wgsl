// Shared by conv.wgsl and pool.wgsl (prepended to both; see `pipelines::INCLUDES`).
// The window geometry: n images of x pixels, kernel k, output o, stride s, dilation d,
// padding before pad (spatial dims canonicalised to three).
struct Window {
    n: u32,
    x: array<u32, 3>,
    k: array<u32, 3>,
    o: array<u32, 3>,
    s: array<u32, 3>,
    d: array<u32, 3>,
    pad: array<u32, 3>,
}

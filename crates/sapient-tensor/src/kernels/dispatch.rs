//! The two dispatch patterns the kernels repeat, written once: a function compiled for
//! each instruction-set level and picked at run time ([`simd_dispatch!`](crate::simd_dispatch)),
//! and a `match` from a run-time count to const-generic instances (`by_count!`).

/// Define `fn name(args) [-> ret]` that runs `portable(args)` (an `#[inline(always)]` function written
/// so that it vectorises) compiled with the target features of the first level the CPU has,
/// widest first, else as it is. Each level is a detection function of
/// [`crate::kernels`] (`has_avx512`, `has_avx2`, ...) and the features to compile for:
///
/// ```
/// #[inline(always)]
/// fn halve_portable(x: &mut [f32]) {
///     x.iter_mut().for_each(|v| *v *= 0.5);
/// }
/// sapient_tensor::simd_dispatch! {
///     /// Every value halved.
///     pub fn halve(x: &mut [f32]) = halve_portable for [has_avx512("avx512f,avx2,fma"), has_avx2("avx2,fma")];
/// }
/// let mut v = [2.0f32, 4.0];
/// halve(&mut v);
/// assert_eq!(v, [1.0, 2.0]);
/// ```
///
/// The results are those of `portable` (the features change how it is compiled, not its
/// arithmetic, as long as it does not reassociate).
#[macro_export]
macro_rules! simd_dispatch {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $portable:ident for [$($has:ident($feat:literal)),+ $(,)?];) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) -> $ret {
            $crate::simd_dispatch!(@levels ($($arg: $ty),*) -> $ret, ($($arg),*), $portable, [$($has $feat)+]);
            $portable($($arg),*)
        }
    };
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) = $portable:ident for [$($has:ident($feat:literal)),+ $(,)?];) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) {
            $crate::simd_dispatch!(@levels ($($arg: $ty),*) -> (), ($($arg),*), $portable, [$($has $feat)+]);
            $portable($($arg),*)
        }
    };
    // Each level: `portable` compiled with its features, returned from the caller when the
    // CPU has them.
    (@levels $params:tt -> $ret:ty, $args:tt, $portable:ident, [$($has:ident $feat:literal)+]) => {
        $(
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = $feat)]
                unsafe fn level $params -> $ret {
                    $portable $args
                }
                if $crate::kernels::$has() {
                    // SAFETY: the CPU has the features `level` is compiled for.
                    return unsafe { level $args };
                }
            }
        )+
    };
}

/// `match n` from a run-time count to const-generic instances: each listed count `k` runs
/// `go!(k, extra...)` (`go` a macro of the caller's, `extra` the count's other constants in
/// parentheses), the one after `_` every other count (the largest).
///
/// `by_count!(nr => go { 1 (8), 2 (4), 3 (2); _ => 4 (2) })` is
/// `match nr { 1 => go!(1, 8), 2 => go!(2, 4), 3 => go!(3, 2), _ => go!(4, 2) }`.
macro_rules! by_count {
    ($n:expr => $go:ident { $($k:literal $(($($x:tt)*))?),+ ; _ => $last:literal $(($($y:tt)*))? }) => {
        match $n {
            $($k => $go!($k $(, $($x)*)?),)+
            _ => $go!($last $(, $($y)*)?),
        }
    };
}
pub(crate) use by_count;

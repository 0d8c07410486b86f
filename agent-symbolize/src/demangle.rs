//! Human-readable names for Rust (legacy and v0) and C++ (Itanium) symbols.
//! The mangled name always stays available as the pprof `system_name`.

use std::borrow::Cow;

/// How much of a demangled name to show.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DemangleMode {
    /// The names as the objects spell them.
    None,
    /// Rust without the hash, C++ without parameter lists, return types,
    /// template arguments, ABI tags and clone suffixes: one name per
    /// function, as a flame graph wants it.
    #[default]
    Simplified,
    /// As simplified, but C++ names keep their template arguments
    /// (`std::vector<int, std::allocator<int> >::push_back`), as
    /// `pyroscope.ebpf`'s `templates` mode shows them.
    Templates,
    /// Everything the demangler produces.
    Full,
}

/// Mangled names longer than this are shown as is: demangling cost grows
/// with the name, and such names come from generated code nobody reads.
const MAX_MANGLED_LEN: usize = 16 << 10;

/// Demangles `name` according to `mode`; names that are not mangled (C,
/// kernel, JIT) come back unchanged.
pub fn demangle(name: &str, mode: DemangleMode) -> String {
    if mode == DemangleMode::None || name.len() > MAX_MANGLED_LEN {
        return name.to_owned();
    }
    if let Ok(demangled) = rustc_demangle::try_demangle(name) {
        return match mode {
            DemangleMode::Full => format!("{demangled}"),
            _ => format!("{demangled:#}"),
        };
    }
    if name.starts_with("_Z")
        && let Some(demangled) = demangle_cpp(name, mode)
    {
        return demangled;
    }
    name.to_owned()
}

fn demangle_cpp(name: &str, mode: DemangleMode) -> Option<String> {
    let symbol = cpp_demangle::Symbol::new(name.as_bytes()).ok()?;
    let options = match mode {
        DemangleMode::Full => cpp_demangle::DemangleOptions::new(),
        _ => cpp_demangle::DemangleOptions::new()
            .no_params()
            .no_return_type(),
    };
    let demangled = symbol.demangle_with_options(&options).ok()?;
    Some(match mode {
        DemangleMode::Full | DemangleMode::Templates => demangled,
        _ => simplify_cpp(&demangled).into_owned(),
    })
}

/// Drops template argument lists, `[abi:...]` tags and ` [clone ...]`
/// suffixes from a demangled C++ name, keeping `operator<`, `operator<<`,
/// `operator->` and friends intact.
fn simplify_cpp(name: &str) -> Cow<'_, str> {
    if !name.contains(['<', '[']) {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len());
    let mut depth = 0usize;
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("operator") {
            let symbol_len = after
                .find(|c: char| !matches!(c, '<' | '>' | '=' | '-'))
                .unwrap_or(after.len());
            if depth == 0 {
                out.push_str(&rest[.."operator".len() + symbol_len]);
            }
            rest = &after[symbol_len..];
            continue;
        }
        if depth == 0
            && let Some(tail) = rest
                .strip_prefix(" [clone ")
                .or_else(|| rest.strip_prefix("[abi:"))
            && let Some(end) = tail.find(']')
        {
            rest = &tail[end + 1..];
            continue;
        }
        match c {
            '<' => {
                if depth == 0 {
                    // `operator<< <char_traits>`: the space went with the list.
                    out.truncate(out.trim_end().len());
                }
                depth += 1;
            }
            '>' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
        rest = &rest[c.len_utf8()..];
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUST_LEGACY: &str = "_ZN4core3ptr13drop_in_place17h0123456789abcdefE";
    const RUST_V0: &str = "_RNvCs1234_5chain9level_one";
    /// `std::vector<int, std::allocator<int> >::push_back(int const&)`
    const CPP_METHOD: &str = "_ZNSt6vectorIiSaIiEE9push_backERKi";
    /// `bool ns::less<int>(int, int)`: a template function with a return type.
    const CPP_TEMPLATE: &str = "_ZN2ns4lessIiEEbii";
    /// `ns::Point::operator<(ns::Point const&) const`
    const CPP_OPERATOR: &str = "_ZNK2ns5PointltERKS0_";
    /// `std::ostream& std::operator<< <std::char_traits<char> >(std::ostream&, char const*)`
    const CPP_SHIFT: &str = "_ZStlsISt11char_traitsIcEERSt13basic_ostreamIcT_ES5_PKc";
    /// `level_one(unsigned long) [clone .constprop.0]`
    const CPP_CLONE: &str = "_Z9level_onem.constprop.0";

    #[test]
    fn none_keeps_every_name_as_is() {
        for name in [RUST_LEGACY, RUST_V0, CPP_METHOD, CPP_CLONE, "burn_leaf"] {
            assert_eq!(demangle(name, DemangleMode::None), name);
        }
    }

    #[test]
    fn rust_names_lose_their_hash_when_simplified() {
        assert_eq!(
            demangle(RUST_LEGACY, DemangleMode::Simplified),
            "core::ptr::drop_in_place"
        );
        assert_eq!(
            demangle(RUST_LEGACY, DemangleMode::Full),
            "core::ptr::drop_in_place::h0123456789abcdef"
        );
        assert_eq!(
            demangle(RUST_V0, DemangleMode::Simplified),
            "chain::level_one"
        );
        assert_eq!(
            demangle(RUST_V0, DemangleMode::Full),
            "chain[3c1c0]::level_one"
        );
    }

    #[test]
    fn cpp_names_are_simplified_to_one_name_per_function() {
        assert_eq!(
            demangle(CPP_METHOD, DemangleMode::Simplified),
            "std::vector::push_back"
        );
        assert_eq!(
            demangle(CPP_METHOD, DemangleMode::Full),
            "std::vector<int, std::allocator<int> >::push_back(int const&)"
        );
        assert_eq!(demangle(CPP_TEMPLATE, DemangleMode::Simplified), "ns::less");
        assert_eq!(
            demangle(CPP_TEMPLATE, DemangleMode::Templates),
            "ns::less<int>"
        );
        assert_eq!(
            demangle(CPP_METHOD, DemangleMode::Templates),
            "std::vector<int, std::allocator<int> >::push_back"
        );
        assert_eq!(
            demangle(RUST_LEGACY, DemangleMode::Templates),
            "core::ptr::drop_in_place"
        );
        assert_eq!(
            demangle(CPP_TEMPLATE, DemangleMode::Full),
            "bool ns::less<int>(int, int)"
        );
        assert_eq!(
            demangle(CPP_OPERATOR, DemangleMode::Simplified),
            "ns::Point::operator<"
        );
        assert_eq!(
            demangle(CPP_OPERATOR, DemangleMode::Full),
            "ns::Point::operator<(ns::Point const&) const"
        );
        assert_eq!(
            demangle(CPP_SHIFT, DemangleMode::Simplified),
            "std::operator<<"
        );
        assert_eq!(demangle(CPP_CLONE, DemangleMode::Simplified), "level_one");
        assert_eq!(
            demangle(CPP_CLONE, DemangleMode::Full),
            "level_one(unsigned long) [clone .constprop.0]"
        );
    }

    #[test]
    fn plain_and_broken_names_come_back_unchanged() {
        for mode in [DemangleMode::Simplified, DemangleMode::Full] {
            assert_eq!(demangle("burn_leaf", mode), "burn_leaf");
            assert_eq!(demangle("burn_leaf.cold", mode), "burn_leaf.cold");
            assert_eq!(demangle("_Z", mode), "_Z");
            assert_eq!(demangle("_ZN3foo", mode), "_ZN3foo");
            assert_eq!(demangle("_RNvC", mode), "_RNvC");
            assert_eq!(demangle("", mode), "");
        }
        let huge = format!("_ZN{}E", "3foo".repeat(MAX_MANGLED_LEN));
        assert_eq!(demangle(&huge, DemangleMode::Full), huge);
    }

    #[test]
    fn simplify_keeps_arrow_and_comparison_operators() {
        assert_eq!(simplify_cpp("a::b<c>::operator->"), "a::b::operator->");
        assert_eq!(simplify_cpp("x::operator<=> <int>"), "x::operator<=>");
        assert_eq!(simplify_cpp("x::operator>>"), "x::operator>>");
        assert_eq!(simplify_cpp("f[abi:cxx11]"), "f");
        assert_eq!(simplify_cpp("unbalanced>"), "unbalanced>");
    }
}

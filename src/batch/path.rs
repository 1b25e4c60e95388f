//! Where a tensor sits in a batch: [`Path`], given by [`Batch::visit_paths`](super::Batch::visit_paths).

use std::borrow::Cow;
use std::fmt;

/// One step from a batch's root towards a tensor.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Step {
    /// A named field of a struct (or a tuple's position, `0`, `1`, ...), or an enum variant.
    Field(Cow<'static, str>),
    /// A position in a sequence (`Vec`, array, [`Value::List`](super::Value::List)).
    Index(usize),
    /// A key of a map with string keys ([`Value::Map`](super::Value::Map)).
    Key(String),
    /// The `n`-th entry of a container that names none of its own (a `BTreeMap`, whose
    /// keys may have no text form), or the `n`-th tensor of a type whose `Batch`
    /// implementation gives no paths, in visit order.
    Nth(usize),
    /// The entry of a container whose order is its own (a `HashMap`), named by its key's
    /// hash (`std::hash::DefaultHasher::new()`, fixed keys: the same key gets the same
    /// name in every map of the process). Two such maps holding the same keys may list
    /// them in different orders (a map rebuilt by a transfer is sized for what it holds,
    /// the original perhaps for more), so positions would pair one key's tensor with
    /// another's; [`verify`](crate::verify) and copies into existing tensors pair entries
    /// by this name. Two keys of one map with the same hash would share a name: both
    /// refuse such a map ([`Batch::keys_differ`](crate::Batch::keys_differ) names it).
    /// Shown as `{#` and 16 hex digits `}`.
    Unordered(u64),
}

/// The steps from a batch's root to one of its tensors, shown as Rust would reach it:
/// `images[3]`, `meta.labels.0`, `["scores"]`, `boxes#2` (the third tensor of a container
/// that names none). The batch itself, when it is a tensor, is the empty path.
///
/// ```
/// use pinlane::batch::{Path, Step};
/// let mut p = Path::default();
/// p.push(Step::Field("images".into()));
/// p.push(Step::Index(3));
/// assert_eq!(p.to_string(), "images[3]");
/// assert_eq!(Path::default().to_string(), "(the batch itself)");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Path(Vec<Step>);

impl Path {
    /// The steps, from the root.
    pub fn steps(&self) -> &[Step] {
        &self.0
    }

    /// Appends a step (going one level down).
    pub fn push(&mut self, step: Step) {
        self.0.push(step);
    }

    /// Removes the last step (going back up).
    pub fn pop(&mut self) -> Option<Step> {
        self.0.pop()
    }

    /// Runs `f` with `step` pushed, then pops it.
    pub fn with<R>(&mut self, step: Step, f: impl FnOnce(&mut Path) -> R) -> R {
        self.0.push(step);
        let r = f(self);
        self.0.pop();
        r
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(the batch itself)");
        }
        for (i, s) in self.0.iter().enumerate() {
            match s {
                Step::Field(name) if i == 0 => f.write_str(name)?,
                Step::Field(name) => write!(f, ".{name}")?,
                Step::Index(n) => write!(f, "[{n}]")?,
                Step::Key(k) => write!(f, "[{k:?}]")?,
                Step::Nth(n) => write!(f, "#{n}")?,
                Step::Unordered(h) => write!(f, "{{#{h:016x}}}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_as_rust_reaches_it() {
        let mut p = Path::default();
        p.push(Step::Field("meta".into()));
        p.push(Step::Key("a b".into()));
        p.push(Step::Index(2));
        p.push(Step::Field("0".into()));
        p.push(Step::Nth(1));
        assert_eq!(p.to_string(), r#"meta["a b"][2].0#1"#);
        let shown = p.with(Step::Unordered(0xab), |p| p.to_string());
        assert_eq!(shown, r#"meta["a b"][2].0#1{#00000000000000ab}"#);
        assert_eq!(p.pop(), Some(Step::Nth(1)));
        assert_eq!(p.steps().len(), 4);
        let shown = p.with(Step::Index(9), |p| p.to_string());
        assert_eq!(shown, r#"meta["a b"][2].0[9]"#);
        assert_eq!(p.steps().len(), 4, "popped again");
    }
}

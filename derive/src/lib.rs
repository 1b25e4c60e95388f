//! `#[derive(Batch)]` for pinlane: structs (named, tuple, unit) and enums.
//!
//! Every field is visited and rebuilt through its own `Batch` impl, in declaration order
//! (and its tensors' paths named after it, `field` or `0`, `Variant.field` in enums;
//! `keys_differ` asks every field's own);
//! a field marked `#[batch(skip)]` is cloned unchanged (its type needs `Clone`, not
//! `Batch`). Each type parameter gets a `Batch` bound. Re-exported by `pinlane` behind its
//! default `derive` feature; use it as `pinlane::Batch`.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::{format_ident, quote};
use syn::ext::IdentExt;
use syn::{parse_macro_input, parse_quote, Data, DeriveInput, Fields, Ident};

/// Implements `pinlane::Batch` for a struct or enum: every field visited and rebuilt in
/// declaration order, `#[batch(skip)]` fields cloned unchanged.
#[proc_macro_derive(Batch, attributes(batch))]
pub fn derive_batch(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(input) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// Whether a field carries `#[batch(skip)]`; any other `#[batch(..)]` is an error.
/// An empty `#[batch()]` is an error too: it says nothing, and was likely meant as `skip`.
fn is_skipped(attrs: &[syn::Attribute]) -> syn::Result<bool> {
    let mut skip = false;
    for attr in attrs.iter().filter(|a| a.path().is_ident("batch")) {
        let mut said = false;
        attr.parse_nested_meta(|meta| {
            said = true;
            if meta.path.is_ident("skip") {
                skip = true;
                Ok(())
            } else {
                Err(meta.error("unknown batch attribute; expected `skip`"))
            }
        })?;
        if !said {
            return Err(syn::Error::new_spanned(
                attr,
                "empty `#[batch()]`; expected `#[batch(skip)]`",
            ));
        }
    }
    Ok(skip)
}

/// One field: how to reach it, and whether it is skipped.
struct FieldInfo {
    /// `self.name` / `self.0` for structs, a binding for enum variants.
    access: Tokens,
    /// Field name for named fields; `None` for tuple fields.
    name: Option<Ident>,
    skip: bool,
}

fn fields_of(
    fields: &Fields,
    bind: bool,
    skipped_types: &mut Vec<syn::Type>,
) -> syn::Result<Vec<FieldInfo>> {
    let mut out = Vec::new();
    for (i, f) in fields.iter().enumerate() {
        let skip = is_skipped(&f.attrs)?;
        if skip {
            skipped_types.push(f.ty.clone());
        }
        let access = match (&f.ident, bind) {
            (Some(id), false) => quote!(self.#id),
            (None, false) => {
                let idx = syn::Index::from(i);
                quote!(self.#idx)
            }
            (Some(id), true) => quote!(#id),
            (None, true) => {
                let id = format_ident!("__field{}", i);
                quote!(#id)
            }
        };
        out.push(FieldInfo {
            access,
            name: f.ident.clone(),
            skip,
        });
    }
    Ok(out)
}

/// One of the generated code's own names (`__f`, `__path`, `__p`, `__other`), mixed-site:
/// a field of the user's with that name (bound by name in an enum variant's pattern) does
/// not shadow it.
fn own(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

fn visit_body(fields: &[FieldInfo], by_ref: bool) -> Tokens {
    let hf = own("__f");
    let calls = fields.iter().filter(|f| !f.skip).map(|f| {
        let a = &f.access;
        let r = if by_ref { quote!(&#a) } else { quote!(#a) };
        quote!(::pinlane::Batch::visit(#r, #hf);)
    });
    quote!(#(#calls)*)
}

/// The name of field `i`'s step in paths: its name, or its position in a tuple. A raw
/// identifier shows as the field's name: `r#type` is `type`.
fn step_name(i: usize, f: &FieldInfo) -> String {
    f.name
        .as_ref()
        .map_or_else(|| i.to_string(), |n| n.unraw().to_string())
}

/// `visit_paths` of the fields: each visited under its name (or position).
fn visit_paths_body(fields: &[FieldInfo], by_ref: bool) -> Tokens {
    let (hf, hpath, hp) = (own("__f"), own("__path"), own("__p"));
    let calls = fields
        .iter()
        .enumerate()
        .filter(|(_, f)| !f.skip)
        .map(|(i, f)| {
            let a = &f.access;
            let r = if by_ref { quote!(&#a) } else { quote!(#a) };
            let name = step_name(i, f);
            quote!(#hpath.with(
            ::pinlane::batch::Step::Field(::std::borrow::Cow::Borrowed(#name)),
            |#hp| ::pinlane::Batch::visit_paths(#r, #hp, #hf),
        );)
        });
    quote!(#(#calls)*)
}

/// `keys_differ` of the fields, each under its name (or position), paired with the same
/// field of the other value (`others`: how to reach each there); the first `Some`.
fn keys_differ_body(fields: &[FieldInfo], others: &[Tokens], by_ref: bool) -> Tokens {
    let (hpath, hp) = (own("__path"), own("__p"));
    let calls = fields
        .iter()
        .zip(others)
        .enumerate()
        .filter(|(_, (f, _))| !f.skip)
        .map(|(i, (f, o))| {
            let a = &f.access;
            let (r, ro) = if by_ref {
                (quote!(&#a), quote!(&#o))
            } else {
                (quote!(#a), quote!(#o))
            };
            let name = step_name(i, f);
            quote!(.or_else(|| #hpath.with(
                ::pinlane::batch::Step::Field(::std::borrow::Cow::Borrowed(#name)),
                |#hp| ::pinlane::Batch::keys_differ(#r, #ro, #hp),
            )))
        });
    quote!(::core::option::Option::None #(#calls)*)
}

/// The constructor's field list, each field rebuilt or cloned.
fn rebuild_fields(fields: &[FieldInfo], shape: &Fields, by_ref: bool) -> Tokens {
    let hf = own("__f");
    let vals = fields.iter().map(|f| {
        let a = &f.access;
        let r = if by_ref { quote!(&#a) } else { quote!(#a) };
        if f.skip {
            quote!(::core::clone::Clone::clone(#r))
        } else {
            quote!(::pinlane::Batch::rebuild(#r, #hf))
        }
    });
    match shape {
        Fields::Named(_) => {
            let names = fields.iter().map(|f| f.name.as_ref());
            quote!({ #(#names: #vals),* })
        }
        Fields::Unnamed(_) => quote!(( #(#vals),* )),
        Fields::Unit => quote!(),
    }
}

/// The pattern binding every field of a variant by reference.
fn variant_pattern(fields: &[FieldInfo], shape: &Fields) -> Tokens {
    let binds = fields.iter().map(|f| &f.access);
    match shape {
        Fields::Named(_) => quote!({ #(#binds),* }),
        Fields::Unnamed(_) => quote!(( #(#binds),* )),
        Fields::Unit => quote!(),
    }
}

/// The other value's bindings for a variant's fields (`__other{i}`), and the pattern
/// binding them.
fn other_pattern(fields: &[FieldInfo], shape: &Fields) -> (Vec<Tokens>, Tokens) {
    // Mixed-site ([`own`]): a field of the variant named `__other0` does not clash.
    let binds: Vec<Tokens> = (0..fields.len())
        .map(|i| {
            let id = own(&format!("__other{i}"));
            quote!(#id)
        })
        .collect();
    let pat = match shape {
        Fields::Named(_) => {
            let names = fields.iter().map(|f| f.name.as_ref());
            quote!({ #(#names: #binds),* })
        }
        Fields::Unnamed(_) => quote!(( #(#binds),* )),
        Fields::Unit => quote!(),
    };
    (binds, pat)
}

fn expand(input: DeriveInput) -> syn::Result<Tokens> {
    // `#[batch(..)]` is a field's (or a variant's field's): on the type it would be
    // ignored, and a `#[batch(skip)]` there would skip nothing.
    if let Some(a) = input.attrs.iter().find(|a| a.path().is_ident("batch")) {
        return Err(syn::Error::new_spanned(
            a,
            "`#[batch(..)]` goes on a field (`#[batch(skip)]`), not on the type",
        ));
    }
    let (hf, hpath, hother) = (own("__f"), own("__path"), own("__other"));
    let name = &input.ident;
    let mut skipped_types = Vec::new();
    let (visit, rebuild, paths, keys) = match &input.data {
        Data::Struct(s) => {
            let fields = fields_of(&s.fields, false, &mut skipped_types)?;
            let v = visit_body(&fields, true);
            let r = rebuild_fields(&fields, &s.fields, true);
            let p = visit_paths_body(&fields, true);
            let others: Vec<Tokens> = s
                .fields
                .iter()
                .enumerate()
                .map(|(i, f)| match &f.ident {
                    Some(id) => quote!(#hother.#id),
                    None => {
                        let idx = syn::Index::from(i);
                        quote!(#hother.#idx)
                    }
                })
                .collect();
            let k = keys_differ_body(&fields, &others, true);
            (v, quote!(#name #r), p, k)
        }
        Data::Enum(e) => {
            let mut visit_arms = Vec::new();
            let mut rebuild_arms = Vec::new();
            let mut path_arms = Vec::new();
            let mut key_arms = Vec::new();
            for var in &e.variants {
                if let Some(a) = var.attrs.iter().find(|a| a.path().is_ident("batch")) {
                    return Err(syn::Error::new_spanned(
                        a,
                        "#[batch(..)] goes on fields, not variants",
                    ));
                }
                let vname = &var.ident;
                let fields = fields_of(&var.fields, true, &mut skipped_types)?;
                let pat = variant_pattern(&fields, &var.fields);
                let v = visit_body(&fields, false);
                let r = rebuild_fields(&fields, &var.fields, false);
                visit_arms.push(quote!(#name::#vname #pat => { #v }));
                rebuild_arms.push(quote!(#name::#vname #pat => #name::#vname #r));
                let p = visit_paths_body(&fields, false);
                let vstr = vname.unraw().to_string();
                let (others, other_pat) = other_pattern(&fields, &var.fields);
                let k = keys_differ_body(&fields, &others, false);
                key_arms.push(quote!((#name::#vname #pat, #name::#vname #other_pat) => {
                    #hpath.with(
                        ::pinlane::batch::Step::Field(::std::borrow::Cow::Borrowed(#vstr)),
                        |#hpath| #k,
                    )
                }));
                path_arms.push(quote!(#name::#vname #pat => {
                    #hpath.with(
                        ::pinlane::batch::Step::Field(::std::borrow::Cow::Borrowed(#vstr)),
                        |#hpath| { #p },
                    );
                }));
            }
            if e.variants.is_empty() {
                (
                    quote!(match *self {}),
                    quote!(match *self {}),
                    quote!(match *self {}),
                    quote!(match *self {}),
                )
            } else {
                // Other variants: their paths differ (each is named), so nothing to pair.
                let rest =
                    (e.variants.len() > 1).then(|| quote!(_ => ::core::option::Option::None,));
                (
                    quote!(match self { #(#visit_arms)* }),
                    quote!(match self { #(#rebuild_arms,)* }),
                    quote!(match self { #(#path_arms)* }),
                    quote!(match (self, #hother) { #(#key_arms)* #rest }),
                )
            }
        }
        Data::Union(u) => {
            return Err(syn::Error::new(
                u.union_token.span,
                "Batch cannot be derived for unions",
            ))
        }
    };

    let mut generics = input.generics.clone();
    for p in generics.type_params_mut() {
        p.bounds.push(parse_quote!(::pinlane::Batch));
    }
    {
        let wc = generics.make_where_clause();
        for ty in skipped_types {
            wc.predicates.push(parse_quote!(#ty: ::core::clone::Clone));
        }
    }
    let (impl_g, ty_g, where_c) = generics.split_for_impl();
    let lt = syn::Lifetime::new("'__batch", Span::call_site());
    Ok(quote! {
        #[automatically_derived]
        impl #impl_g ::pinlane::Batch for #name #ty_g #where_c {
            #[allow(unused_variables)]
            fn visit<#lt>(&#lt self, #hf: &mut dyn FnMut(&#lt ::pinlane::Tensor)) {
                #visit
            }
            #[allow(unused_variables)]
            fn rebuild(&self, #hf: &mut dyn FnMut(&::pinlane::Tensor) -> ::pinlane::Tensor) -> Self {
                #rebuild
            }
            #[allow(unused_variables)]
            fn visit_paths<#lt>(
                &#lt self,
                #hpath: &mut ::pinlane::batch::Path,
                #hf: &mut dyn FnMut(&::pinlane::batch::Path, &#lt ::pinlane::Tensor),
            ) {
                #paths
            }
            #[allow(unused_variables)]
            fn keys_differ(
                &self,
                #hother: &Self,
                #hpath: &mut ::pinlane::batch::Path,
            ) -> ::core::option::Option<::pinlane::batch::Path> {
                #keys
            }
        }
    })
}

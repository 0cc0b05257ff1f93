//! `#[derive(Schema)]` and `#[derive(Parse)]` for `sapient_sample::Schema` /
//! `sapient_sample::Parse` (use them through `sapient_sample`, which re-exports both).
//!
//! Structs with named fields become JSON objects (properties in field order; `Option` fields
//! are optional), newtype structs their inner type, enums with only unit variants a string
//! enum, other enums the externally tagged form serde uses (`"Unit"`, `{"Variant": value}`,
//! `{"Variant": {fields}}`). Field attributes: `#[parse(rename = "name")]`,
//! `#[parse(pattern = "regex")]`, `#[parse(range = 1..=100)]` (or `a..b`, `a..`, `..=b`),
//! `#[parse(min_len = N, max_len = N)]` (strings), `#[parse(min_items = N, max_items = N)]`
//! (arrays). Doc comments become `description`s. Variants take `#[parse(rename = "...")]`.
//! Objects have `"additionalProperties": false` (the grammar never writes other keys, and
//! `Parse` rejects them). Recursive types (through `Vec`, `Option<Box<_>>`, `Box`) refer to
//! themselves with `$ref` (see `sapient_sample::typed`).

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::quote;
use syn::{parse_macro_input, Attribute, Data, DeriveInput, Fields, LitStr};

#[proc_macro_derive(Schema, attributes(parse))]
pub fn derive_schema(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match schema_impl(&input) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

#[proc_macro_derive(Parse, attributes(parse))]
pub fn derive_parse(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match parse_impl(&input) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// What `#[parse(...)]` and doc comments say about a field, variant or type.
#[derive(Default)]
struct Attrs {
    rename: Option<String>,
    doc: Option<String>,
    /// Extra JSON Schema keywords as (key, value expression).
    keywords: Vec<(String, Tokens)>,
}

fn number_tokens(s: &str, span: proc_macro2::Span) -> syn::Result<Tokens> {
    if s.parse::<i64>().is_ok() {
        let v: i64 = s.parse().map_err(|_| syn::Error::new(span, "bad integer"))?;
        Ok(quote!(#v))
    } else if let Ok(v) = s.parse::<f64>() {
        Ok(quote!(#v))
    } else {
        Err(syn::Error::new(span, format!("`{s}` is not a number")))
    }
}

fn attrs(list: &[Attribute]) -> syn::Result<Attrs> {
    let mut a = Attrs::default();
    let mut docs = Vec::new();
    for attr in list {
        if attr.path().is_ident("doc") {
            if let syn::Meta::NameValue(nv) = &attr.meta {
                if let syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) = &nv.value {
                    docs.push(s.value().trim().to_string());
                }
            }
            continue;
        }
        if !attr.path().is_ident("parse") {
            continue;
        }
        attr.parse_nested_meta(|meta| {
            let key = meta.path.get_ident().map(|i| i.to_string()).unwrap_or_default();
            match key.as_str() {
                "rename" => {
                    let s: LitStr = meta.value()?.parse()?;
                    a.rename = Some(s.value());
                }
                "pattern" => {
                    let s: LitStr = meta.value()?.parse()?;
                    let v = s.value();
                    a.keywords.push(("pattern".into(), quote!(#v)));
                }
                "min_len" | "max_len" | "min_items" | "max_items" => {
                    let n: syn::LitInt = meta.value()?.parse()?;
                    let n: u64 = n.base10_parse()?;
                    let k = match key.as_str() {
                        "min_len" => "minLength",
                        "max_len" => "maxLength",
                        "min_items" => "minItems",
                        _ => "maxItems",
                    };
                    a.keywords.push((k.into(), quote!(#n)));
                }
                "range" => {
                    let ts: Tokens = meta.value()?.parse()?;
                    let span = meta.path.get_ident().map(|i| i.span()).unwrap_or_else(proc_macro2::Span::call_site);
                    let text = ts.to_string().replace(' ', "");
                    let (lo, hi, inclusive) = if let Some((l, h)) = text.split_once("..=") {
                        (l.to_string(), h.to_string(), true)
                    } else if let Some((l, h)) = text.split_once("..") {
                        (l.to_string(), h.to_string(), false)
                    } else {
                        return Err(syn::Error::new(span, "range must look like `1..=100`, `0..10`, `5..` or `..=9`"));
                    };
                    if !lo.is_empty() {
                        a.keywords.push(("minimum".into(), number_tokens(&lo, span)?));
                    }
                    if !hi.is_empty() {
                        let k = if inclusive { "maximum" } else { "exclusiveMaximum" };
                        a.keywords.push((k.into(), number_tokens(&hi, span)?));
                    }
                }
                other => return Err(meta.error(format!("unknown parse attribute `{other}`"))),
            }
            Ok(())
        })?;
    }
    if !docs.is_empty() {
        a.doc = Some(docs.join(" ").trim().to_string());
    }
    Ok(a)
}

/// `schema` with the attribute keywords and description merged in.
fn decorate(schema: Tokens, a: &Attrs) -> Tokens {
    let keys = a.keywords.iter().map(|(k, _)| k);
    let vals = a.keywords.iter().map(|(_, v)| v);
    let desc = match &a.doc {
        Some(d) => quote!(::core::option::Option::Some(#d)),
        None => quote!(::core::option::Option::None),
    };
    quote!(::sapient_sample::typed::__decorate(#schema, &[#((#keys, ::sapient_sample::typed::__json(#vals))),*], #desc))
}

fn is_option(ty: &syn::Type) -> bool {
    matches!(ty, syn::Type::Path(p) if p.qself.is_none() && p.path.segments.last().is_some_and(|s| s.ident == "Option"))
}

/// (json name, schema expression, required) per named field.
fn object_schema(fields: &syn::FieldsNamed) -> syn::Result<Tokens> {
    let mut names = Vec::new();
    let mut schemas = Vec::new();
    let mut required = Vec::new();
    for f in &fields.named {
        let a = attrs(&f.attrs)?;
        let name = a.rename.clone().unwrap_or_else(|| f.ident.as_ref().map(|i| i.to_string()).unwrap_or_default());
        let ty = &f.ty;
        schemas.push(decorate(quote!(<#ty as ::sapient_sample::Schema>::json_schema()), &a));
        if !is_option(ty) {
            required.push(name.clone());
        }
        names.push(name);
    }
    Ok(quote!({
        let mut props = ::sapient_sample::typed::__Map::new();
        #(props.insert(::std::string::String::from(#names), #schemas);)*
        ::sapient_sample::typed::__object(props, &[#(#required),*])
    }))
}

fn variant_name(v: &syn::Variant) -> syn::Result<String> {
    Ok(attrs(&v.attrs)?.rename.unwrap_or_else(|| v.ident.to_string()))
}

fn schema_impl(input: &DeriveInput) -> syn::Result<Tokens> {
    let name = &input.ident;
    let (ig, tg, wc) = input.generics.split_for_impl();
    let top = attrs(&input.attrs)?;
    let body = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(f) => object_schema(f)?,
            Fields::Unnamed(f) if f.unnamed.len() == 1 => {
                let ty = &f.unnamed[0].ty;
                decorate(quote!(<#ty as ::sapient_sample::Schema>::json_schema()), &attrs(&f.unnamed[0].attrs)?)
            }
            _ => return Err(syn::Error::new_spanned(name, "Schema: structs need named fields or exactly one unnamed field")),
        },
        Data::Enum(e) => {
            if e.variants.is_empty() {
                return Err(syn::Error::new_spanned(name, "Schema: an enum needs at least one variant"));
            }
            if e.variants.iter().all(|v| matches!(v.fields, Fields::Unit)) {
                let names = e.variants.iter().map(variant_name).collect::<syn::Result<Vec<_>>>()?;
                quote!(::sapient_sample::typed::__json_enum(&[#(#names),*]))
            } else {
                let mut alts = Vec::new();
                for v in &e.variants {
                    let vn = variant_name(v)?;
                    let inner = match &v.fields {
                        Fields::Unit => {
                            alts.push(decorate(quote!(::sapient_sample::typed::__json_enum(&[#vn])), &attrs(&v.attrs)?));
                            continue;
                        }
                        Fields::Named(f) => object_schema(f)?,
                        Fields::Unnamed(f) if f.unnamed.len() == 1 => {
                            let ty = &f.unnamed[0].ty;
                            decorate(quote!(<#ty as ::sapient_sample::Schema>::json_schema()), &attrs(&f.unnamed[0].attrs)?)
                        }
                        Fields::Unnamed(_) => {
                            return Err(syn::Error::new_spanned(&v.ident, "Schema: tuple variants need exactly one field"))
                        }
                    };
                    let inner = decorate(inner, &attrs(&v.attrs)?);
                    alts.push(quote!({
                        let mut props = ::sapient_sample::typed::__Map::new();
                        props.insert(::std::string::String::from(#vn), #inner);
                        ::sapient_sample::typed::__object(props, &[#vn])
                    }));
                }
                quote!(::sapient_sample::typed::__any_of(::std::vec![#(#alts),*]))
            }
        }
        Data::Union(_) => return Err(syn::Error::new_spanned(name, "Schema: unions are not supported")),
    };
    let body = decorate(body, &Attrs { rename: None, doc: top.doc, keywords: top.keywords });
    Ok(quote! {
        impl #ig ::sapient_sample::Schema for #name #tg #wc {
            fn json_schema() -> ::sapient_sample::typed::__Value {
                ::sapient_sample::typed::__named(::core::any::type_name::<Self>(), || #body)
            }
        }
    })
}

/// Expression building the named fields of `ctor` from the JSON object `obj` at `path`.
fn fields_from(ctor: Tokens, fields: &syn::FieldsNamed) -> syn::Result<Tokens> {
    let mut inits = Vec::new();
    for f in &fields.named {
        let a = attrs(&f.attrs)?;
        let ident = f.ident.as_ref().ok_or_else(|| syn::Error::new_spanned(f, "named field expected"))?;
        let key = a.rename.unwrap_or_else(|| ident.to_string());
        let ty = &f.ty;
        inits.push(quote!(#ident: <#ty as ::sapient_sample::Parse>::from_json_field(obj.get(#key), &::std::format!("{}/{}", path, #key))?));
    }
    Ok(quote!(#ctor { #(#inits),* }))
}

fn parse_impl(input: &DeriveInput) -> syn::Result<Tokens> {
    let name = &input.ident;
    let (ig, tg, wc) = input.generics.split_for_impl();
    let obj_of = quote!(let obj = v.as_object().ok_or_else(|| ::sapient_sample::typed::ParseError::Type { path: path.to_string(), expected: "object" })?;);
    let body = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(f) => {
                let build = fields_from(quote!(Self), f)?;
                quote!(#obj_of ::core::result::Result::Ok(#build))
            }
            Fields::Unnamed(f) if f.unnamed.len() == 1 => {
                let ty = &f.unnamed[0].ty;
                quote!(::core::result::Result::Ok(Self(<#ty as ::sapient_sample::Parse>::from_json_at(v, path)?)))
            }
            _ => return Err(syn::Error::new_spanned(name, "Parse: structs need named fields or exactly one unnamed field")),
        },
        Data::Enum(e) => {
            let mut unit_arms = Vec::new();
            let mut data_arms = Vec::new();
            for v in &e.variants {
                let vn = variant_name(v)?;
                let id = &v.ident;
                match &v.fields {
                    Fields::Unit => unit_arms.push(quote!(#vn => return ::core::result::Result::Ok(Self::#id),)),
                    Fields::Named(f) => {
                        let build = fields_from(quote!(Self::#id), f)?;
                        data_arms.push(quote!(#vn => {
                            let v = inner;
                            let path = &::std::format!("{}/{}", path, #vn);
                            #obj_of
                            return ::core::result::Result::Ok(#build);
                        }));
                    }
                    Fields::Unnamed(f) if f.unnamed.len() == 1 => {
                        let ty = &f.unnamed[0].ty;
                        data_arms.push(quote!(#vn => return ::core::result::Result::Ok(Self::#id(
                            <#ty as ::sapient_sample::Parse>::from_json_at(inner, &::std::format!("{}/{}", path, #vn))?)),));
                    }
                    Fields::Unnamed(_) => return Err(syn::Error::new_spanned(id, "Parse: tuple variants need exactly one field")),
                }
            }
            quote! {
                if let ::core::option::Option::Some(s) = v.as_str() {
                    match s {
                        #(#unit_arms)*
                        _ => {}
                    }
                }
                if let ::core::option::Option::Some(m) = v.as_object() {
                    if m.len() == 1 {
                        if let ::core::option::Option::Some((tag, inner)) = m.iter().next() {
                            match tag.as_str() {
                                #(#data_arms)*
                                _ => {}
                            }
                        }
                    }
                }
                ::core::result::Result::Err(::sapient_sample::typed::ParseError::Type { path: path.to_string(), expected: "a variant of the enum" })
            }
        }
        Data::Union(_) => return Err(syn::Error::new_spanned(name, "Parse: unions are not supported")),
    };
    Ok(quote! {
        impl #ig ::sapient_sample::Parse for #name #tg #wc {
            fn from_json_at(v: &::sapient_sample::typed::__Value, path: &str) -> ::core::result::Result<Self, ::sapient_sample::typed::ParseError> {
                #body
            }
        }
    })
}

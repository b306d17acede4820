//! The operations of the page's routes (login, the page itself).

use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::{ContentBuilder, HttpMethod, ObjectBuilder, ResponseBuilder, Type};

use super::doc::*;

pub(super) fn page(d: &mut Doc) {
    let html = || text_response("HTML", "text/html; charset=utf-8");
    let remote = || {
        text_response(
            "The peer is not loopback: the page answers only on loopback (an SSH tunnel from \
             elsewhere)",
            "text/plain; charset=utf-8",
        )
    };
    let home = || {
        ResponseBuilder::new()
            .description("To `/`")
            .header(
                "Location",
                HeaderBuilder::new()
                    .schema(ObjectBuilder::new().schema_type(Type::String).build())
                    .build(),
            )
            .header(
                "Set-Cookie",
                HeaderBuilder::new()
                    .schema(ObjectBuilder::new().schema_type(Type::String).build())
                    .description(Some(
                        "The login cookie (HttpOnly, SameSite=Strict), or its clearing",
                    ))
                    .build(),
            )
    };
    d.add(
        HttpMethod::Get,
        "/",
        Access::Open,
        op(
            "page",
            "page",
            "The page",
            "The page for a live login cookie, else the login form.",
        )
        .response("200", html())
        .response("403", remote()),
    );
    let form = |field: &str, required: bool| {
        let mut object = ObjectBuilder::new().schema_type(Type::Object).property(
            field,
            ObjectBuilder::new().schema_type(Type::String).build(),
        );
        if required {
            object = object.required(field);
        }
        RequestBodyBuilder::new()
            .content(
                "application/x-www-form-urlencoded",
                ContentBuilder::new().schema(Some(object.build())).build(),
            )
            .build()
    };
    d.add(
        HttpMethod::Post,
        "/login",
        Access::Open,
        op(
            "page",
            "login",
            "Log in to the page",
            "`token=` the operator token. Right: a login cookie and 303 to `/`. The token never \
             goes in a URL.",
        )
        .request_body(Some(form("token", true)))
        .response("303", home())
        .response(
            "401",
            text_response("Not the token: the form again", "text/html; charset=utf-8"),
        )
        .response(
            "429",
            text_response(
                "Ten wrong tokens in the last minute: wait a minute",
                "text/html; charset=utf-8",
            ),
        )
        .response("403", remote()),
    );
    d.add(
        HttpMethod::Post,
        "/logout",
        Access::Open,
        op(
            "page",
            "logout",
            "Log out of the page",
            "With the login cookie and its CSRF token (`X-CSRF-Token`, or a `csrf` form field): \
             the login ends and the cookie is cleared.",
        )
        .request_body(Some(form("csrf", false)))
        .response("303", home())
        .response(
            "403",
            text_response(
                "The CSRF token is missing or wrong, or the peer is not loopback",
                "text/plain; charset=utf-8",
            ),
        ),
    );
    for (path, id, kind) in [
        (
            "/page/app.js",
            "pageScript",
            "text/javascript; charset=utf-8",
        ),
        ("/page/app.css", "pageStyle", "text/css; charset=utf-8"),
    ] {
        d.add(
            HttpMethod::Get,
            path,
            Access::Open,
            op(
                "page",
                id,
                "The page's asset",
                "Embedded in the hub's binary.",
            )
            .response("200", text_response("The asset", kind))
            .response("403", remote()),
        );
    }
}

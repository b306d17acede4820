//! The document being built ([`Doc`]): its schemas, paths, security and tags, and the
//! builders every operation uses (answers, parameters, the event logs' query).

use cortex_protocol::signal::ErrorBody;
use serde_json::{Value, json};
use utoipa::ToSchema;
use utoipa::openapi::path::{OperationBuilder, ParameterBuilder, ParameterIn};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::security::{
    ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
};
use utoipa::openapi::tag::TagBuilder;
use utoipa::openapi::{
    ArrayBuilder, ComponentsBuilder, ContentBuilder, HttpMethod, InfoBuilder, ObjectBuilder,
    OpenApi, OpenApiBuilder, PathItem, PathsBuilder, Ref, RefOr, Required, ResponseBuilder, Schema,
    ServerBuilder, ServerVariableBuilder, Type,
};

use crate::server::log::{MAX_WAIT_S, PAGE};

/// The security scheme of the operator token (`Authorization: Bearer …`).
pub const TOKEN_SCHEME: &str = "operatorToken";
/// The security scheme of the page's login cookie.
pub const COOKIE_SCHEME: &str = "pageCookie";

/// What is being built: the schemas the operations use (each with the ones it
/// references) and the paths.
#[derive(Default)]
pub(super) struct Doc {
    schemas: Vec<(String, RefOr<Schema>)>,
    paths: PathsBuilder,
}

/// Who may call a route.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// The operator token, or the page's login cookie (with its CSRF token on changes).
    Operator,
    /// Nobody is asked for anything (the signal route's capability is the waitpoint's
    /// secret, in the body).
    Open,
}

impl Doc {
    /// A reference to `T`'s schema, which (with every schema it references) goes into the
    /// components.
    pub(super) fn schema<T: ToSchema>(&mut self) -> RefOr<Schema> {
        let name = T::name().into_owned();
        if !self.schemas.iter().any(|(n, _)| *n == name) {
            self.schemas.push((name.clone(), T::schema()));
            T::schemas(&mut self.schemas);
        }
        Ref::from_schema_name(name).into()
    }

    /// A JSON answer whose body is a `T`.
    pub(super) fn json<T: ToSchema>(
        &mut self,
        description: &str,
        example: Value,
    ) -> ResponseBuilder {
        let schema = self.schema::<T>();
        json_response(description, schema, example)
    }

    /// A JSON answer whose body is an array of `T`.
    pub(super) fn json_list<T: ToSchema>(
        &mut self,
        description: &str,
        example: Value,
    ) -> ResponseBuilder {
        let schema = ArrayBuilder::new().items(self.schema::<T>()).build();
        json_response(description, schema.into(), example)
    }

    /// An error answer: `{error, message, members?}`; `codes` are the `error` values it
    /// may carry.
    pub(super) fn error(&mut self, description: &str, codes: &[&str]) -> ResponseBuilder {
        let schema = self.schema::<ErrorBody>();
        let codes = codes
            .iter()
            .map(|c| format!("`{c}`"))
            .collect::<Vec<_>>()
            .join(", ");
        ResponseBuilder::new()
            .description(format!("{description} (`error`: {codes})"))
            .content(
                "application/json",
                ContentBuilder::new().schema(Some(schema)).build(),
            )
    }

    /// A JSON request body of type `T`.
    pub(super) fn body<T: ToSchema>(
        &mut self,
        required: bool,
        example: Value,
    ) -> RequestBodyBuilder {
        let schema = self.schema::<T>();
        RequestBodyBuilder::new()
            .required(Some(if required {
                Required::True
            } else {
                Required::False
            }))
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(schema))
                    .example(Some(example))
                    .build(),
            )
    }

    /// Adds `op` as `method path`, with what `access` adds to every such operation.
    pub(super) fn add(
        &mut self,
        method: HttpMethod,
        path: &str,
        access: Access,
        op: OperationBuilder,
    ) {
        let op = match access {
            Access::Operator => {
                let unauthorized = self.error(
                    "No operator token, a wrong one, and no live login cookie",
                    &["unauthorized"],
                );
                let csrf = self.error(
                    "A change made with the page's login cookie without its `X-CSRF-Token`",
                    &["csrf"],
                );
                let unavailable = self.error(
                    "The hub could not write to its store; nothing was recorded, retry shortly",
                    &["store_unavailable"],
                );
                op.securities(Some([
                    SecurityRequirement::new(TOKEN_SCHEME, Vec::<String>::new()),
                    SecurityRequirement::new(COOKIE_SCHEME, Vec::<String>::new()),
                ]))
                .response("401", unauthorized)
                .response("403", csrf)
                .response("503", unavailable)
            }
            Access::Open => op.securities(Some(Vec::<SecurityRequirement>::new())),
        };
        self.paths = std::mem::take(&mut self.paths).path(path, PathItem::new(method, op));
    }

    pub(super) fn finish(self) -> OpenApi {
        let token = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "The operator token: `CORTEX_WEBHOOK_TOKEN`, or the file `$CORTEX_HOME/hub/token` \
                 the hub writes on its first start. It grants `/api`, never the signal route.",
            ))
            .build();
        let cookie = ApiKey::Cookie(ApiKeyValue::with_description(
            crate::server::page::COOKIE,
            "The hub's page's login (`POST /login`), from a loopback peer only. A change \
             (anything but GET and HEAD) made with it must also carry the login's CSRF token in \
             `X-CSRF-Token`, or it is answered 403 `csrf`.",
        ));
        let components = ComponentsBuilder::new()
            .schemas_from_iter(self.schemas)
            .security_scheme(TOKEN_SCHEME, SecurityScheme::Http(token))
            .security_scheme(COOKIE_SCHEME, SecurityScheme::ApiKey(cookie))
            .build();
        let port = ServerVariableBuilder::new()
            .default_value(cortex_protocol::DEFAULT_WEBHOOK_PORT.to_string())
            .description(Some(
                "The hub's `--listen` port (`WEBHOOK_PORT`, default 3001)",
            ))
            .build();
        let server = ServerBuilder::new()
            .url("http://127.0.0.1:{port}")
            .description(Some(
                "The hub's listener, loopback only (from another machine, an SSH tunnel)",
            ))
            .parameter("port", port)
            .build();
        let tags = TAGS.iter().map(|(name, about)| {
            TagBuilder::new()
                .name(*name)
                .description(Some(*about))
                .build()
        });
        OpenApiBuilder::new()
            .info(
                InfoBuilder::new()
                    .title("cortex hub")
                    .version(env!("CARGO_PKG_VERSION"))
                    .description(Some(ABOUT))
                    .build(),
            )
            .servers(Some([server]))
            .paths(self.paths.build())
            .components(Some(components))
            .security(Some([SecurityRequirement::new(
                TOKEN_SCHEME,
                Vec::<String>::new(),
            )]))
            .tags(Some(tags))
            .build()
    }
}

pub(super) const ABOUT: &str = "Durable \"wake me when this finishes\" for agents. A session arms a waitpoint \
(an id and a one-time secret); a job reports to `POST /webhook/signal`; the hub records the \
signal durably and, when the waitpoint's rules say so, appends a `wake` event to the session's \
log. Times are milliseconds since the Unix epoch. Every answer that is not a success is \
`{error, message, members?}` (`ErrorBody`), `error` a stable code. docs/api.md in the \
repository walks through every route with examples.";

pub(super) const TAGS: &[(&str, &str)] = &[
    (
        "sessions",
        "A session: the log a waitpoint's wake lands in, and the agent's configuration",
    ),
    ("messages", "Posting to a session's inbox"),
    (
        "events",
        "A session's event log and the hub's own: a page, a long poll, or SSE",
    ),
    ("waitpoints", "Arming, checking and cancelling waitpoints"),
    (
        "signal",
        "The route jobs call; the waitpoint's secret is the capability",
    ),
    (
        "people",
        "What a person does to a session's agent: answers, approvals, cancels, results",
    ),
    (
        "devices",
        "Enrolling devices, their status, remote waits on them",
    ),
    ("operators", "Health, metrics and this document"),
    (
        "page",
        "The hub's page for operators (HTML, loopback peers only)",
    ),
];

pub(super) fn json_response(
    description: &str,
    schema: RefOr<Schema>,
    example: Value,
) -> ResponseBuilder {
    ResponseBuilder::new().description(description).content(
        "application/json",
        ContentBuilder::new()
            .schema(Some(schema))
            .example(Some(example))
            .build(),
    )
}

pub(super) fn text_response(description: &str, content_type: &str) -> ResponseBuilder {
    ResponseBuilder::new().description(description).content(
        content_type,
        ContentBuilder::new()
            .schema(Some(ObjectBuilder::new().schema_type(Type::String).build()))
            .build(),
    )
}

pub(super) fn op(tag: &str, id: &str, summary: &str, description: &str) -> OperationBuilder {
    OperationBuilder::new()
        .tag(tag)
        .operation_id(Some(id))
        .summary(Some(summary))
        .description(Some(description))
}

pub(super) fn path_param(name: &str, description: &str, example: &str) -> ParameterBuilder {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Path)
        .required(Required::True)
        .description(Some(description))
        .schema(Some(ObjectBuilder::new().schema_type(Type::String).build()))
        .example(Some(json!(example)))
}

pub(super) fn query_param(name: &str, schema: Schema, description: &str) -> ParameterBuilder {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Query)
        .required(Required::False)
        .description(Some(description))
        .schema(Some(schema))
}

pub(super) fn sid() -> ParameterBuilder {
    path_param("sid", "The session's id", "ses_f34c0a6e83ea")
}

pub(super) fn seconds(minimum: u64) -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(minimum as f64))
        .build()
        .into()
}

/// The event logs' query: `after` and `wait`.
pub(super) fn log_params(op: OperationBuilder) -> OperationBuilder {
    op.parameter(query_param(
        "after",
        seconds(0),
        "Only events with a `seq` above this one [default: 0, from the start]",
    ))
    .parameter(query_param(
        "wait",
        seconds(0),
        &format!(
            "A long poll: when nothing is after `after`, wait up to this many seconds (at most \
             {MAX_WAIT_S}) and answer as soon as something lands; an empty page when nothing did"
        ),
    ))
}

/// The 200 of an event log: a page of JSON, or with `Accept: text/event-stream` a live
/// SSE stream.
pub(super) fn log_ok(page: RefOr<Schema>, example: Value) -> ResponseBuilder {
    ResponseBuilder::new()
        .description(format!(
            "At most {PAGE} events after `after`, oldest first (ask again after the last `seq` \
             for more). With `Accept: text/event-stream`: a stream that sends every stored event \
             after `after` and then each one as it lands (`event: event`, `id:` its seq, `data:` \
             the event's JSON), a keep-alive comment every 15 s; a session's stream also \
             carries `event: live` messages, the model's text as it arrives (`model-delta`, \
             `output-delta`, `output-partial` with `live: true`), never stored. A stream \
             resumes after a `Last-Event-ID` header's seq when it is later than `after`. Past \
             `limits.followerBytes` unread by all followers together, the slowest (holding \
             unread bytes, longest since they took any) are dropped (the connection closed); they resume after their last seq."
        ))
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(page))
                .example(Some(example))
                .build(),
        )
        .content(
            "text/event-stream",
            ContentBuilder::new()
                .schema(Some(ObjectBuilder::new().schema_type(Type::String).build()))
                .build(),
        )
}

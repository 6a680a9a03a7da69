//! `POST /v1/chat/completions`: message validation and the prompt template.
//!
//! The simulated model needs one prompt string; messages are rendered with a simple,
//! documented template (one block per message, then the assistant's turn):
//!
//! ```text
//! <|system|>
//! You are terse.
//! <|user|>
//! Hello
//! <|assistant|>
//! ```
//!
//! Content may be a string or an array of parts; text parts are concatenated, image parts
//! are counted (for routing's vision capability) but contribute no text.

use super::wire::{body_error, BodyError, ChatBody, Content, Message};

/// Roles OpenAI's chat API accepts.
pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// What a chat request asks of a backend: the text of every message (string contents and
/// text parts) for the size estimate, vision for any `image_url` part, tools for a
/// non-empty `tools`, JSON mode for `response_format.type == "json_object"`.
pub fn needs(body: &ChatBody, b: &mut crate::router::RequirementsBuilder<'_>) {
    for m in body.messages.iter().flatten() {
        match &m.content {
            Some(Content::Text(t)) => {
                b.text(t);
            }
            Some(Content::Parts(parts)) => {
                for p in parts {
                    if let Some(t) = &p.text {
                        b.text(t);
                    }
                    b.content_part(&p.kind);
                }
            }
            None => {}
        }
    }
    b.tools(body.tools.as_ref().map_or(0, Vec::len));
    b.response_format(
        body.response_format
            .as_ref()
            .and_then(|f| f.kind.as_deref()),
    );
}

/// Renders validated messages into the prompt template.
pub fn render_prompt(messages: Option<Vec<Message>>) -> Result<String, BodyError> {
    let Some(messages) = messages else {
        return Err(body_error(
            "missing_field",
            "missing required field 'messages'",
        ));
    };
    if messages.is_empty() {
        return Err(body_error(
            "invalid_value",
            "'messages' must contain at least one message",
        ));
    }
    let mut prompt = String::new();
    for (i, m) in messages.iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(body_error(
                "invalid_value",
                format!(
                    "'messages[{i}].role' is '{}': expected one of {}",
                    m.role,
                    ROLES.join(", ")
                ),
            ));
        }
        let text = match &m.content {
            None if m.role == "assistant" => String::new(),
            None => {
                return Err(body_error(
                    "missing_field",
                    format!("missing required field 'messages[{i}].content'"),
                ))
            }
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut t = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(s)) => t.push_str(s),
                        ("text", None) => {
                            return Err(body_error(
                                "missing_field",
                                format!("missing 'messages[{i}].content[{j}].text'"),
                            ))
                        }
                        _ => {}
                    }
                }
                t
            }
        };
        prompt.push_str("<|");
        prompt.push_str(&m.role);
        prompt.push_str("|>\n");
        prompt.push_str(&text);
        prompt.push('\n');
    }
    prompt.push_str("<|assistant|>\n");
    Ok(prompt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::wire::parse_body;

    #[test]
    fn messages_render_with_the_documented_template() {
        let b: ChatBody = parse_body(
            br#"{"messages":[{"role":"system","content":"Be terse."},
                {"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url","image_url":{"url":"x"}}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            render_prompt(b.messages).unwrap(),
            "<|system|>\nBe terse.\n<|user|>\nHi\n<|assistant|>\n"
        );
    }

    #[test]
    fn bad_messages_name_what_is_wrong() {
        assert_eq!(
            render_prompt(None).unwrap_err().message,
            "missing required field 'messages'"
        );
        assert!(render_prompt(Some(vec![]))
            .unwrap_err()
            .message
            .contains("at least one"));
        let b: ChatBody = parse_body(br#"{"messages":[{"role":"wizard","content":"x"}]}"#).unwrap();
        let e = render_prompt(b.messages).unwrap_err();
        assert!(
            e.message.contains("'messages[0].role' is 'wizard'"),
            "{}",
            e.message
        );
        let b: ChatBody = parse_body(br#"{"messages":[{"role":"user"}]}"#).unwrap();
        assert!(render_prompt(b.messages)
            .unwrap_err()
            .message
            .contains("messages[0].content"));
    }
}

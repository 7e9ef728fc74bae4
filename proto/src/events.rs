//! Events ECI itself adds to a container group (its "custom events"), beside the ones a
//! kubelet would raise: the reasons and message shapes Alibaba documents for them. mock-eci
//! writes them and the daemon reads them, so both use this one spelling.
//!
//! Only the image-cache events are here: the daemon reads the cache a group matched from
//! `SuccessfulHitImageCache`, the one place ECI's answers name it (no field of
//! CreateContainerGroup's or DescribeContainerGroups' answers does).

/// Normal: the group was created from an image cache, named in the message.
pub const HIT_IMAGE_CACHE: &str = "SuccessfulHitImageCache";
/// Warning: `AutoMatchImageCache` found no cache holding the group's images.
pub const IMAGE_CACHE_MISSED: &str = "ImageCacheMissed";

/// The tag ECI puts before the messages of its image-cache events.
const IMAGE_CACHE_TAG: &str = "[eci.imagecache]";
/// What precedes the cache id in a [`HIT_IMAGE_CACHE`] message.
const HIT_LEAD: &str = "Successfully hit image cache ";

/// The message of a [`HIT_IMAGE_CACHE`] event for cache `id`, as ECI words it.
pub fn hit_image_cache_message(id: &str) -> String {
    format!("{IMAGE_CACHE_TAG}{HIT_LEAD}{id}, eci will be scheduled with this image cache.")
}

/// The message of an [`IMAGE_CACHE_MISSED`] event, as ECI words it.
pub fn image_cache_missed_message() -> String {
    format!("{IMAGE_CACHE_TAG}Missed image cache.")
}

/// The cache id a [`HIT_IMAGE_CACHE`] message names: `imc-` and lowercase letters or digits,
/// or `None` for any other text (an id is written onto a pod, so nothing else passes).
pub fn hit_image_cache_id(message: &str) -> Option<&str> {
    let start = message.find(HIT_LEAD)? + HIT_LEAD.len();
    let rest = &message[start..];
    let end = rest
        .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
        .unwrap_or(rest.len());
    let id = &rest[..end];
    let body = id.strip_prefix("imc-")?;
    let valid = !body.is_empty()
        && body.len() <= 64
        && body
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    valid.then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_id_is_read_from_ecis_message_only() {
        let cases = [
            (
                hit_image_cache_message("imc-2ze5hdcnngenmwc1jmwf"),
                Some("imc-2ze5hdcnngenmwc1jmwf"),
            ),
            // As ECI documents it, without the tag and the tail.
            (
                "Successfully hit image cache imc-6we5ooph73m.".into(),
                Some("imc-6we5ooph73m"),
            ),
            ("Successfully hit image cache imc-.".into(), None),
            ("Successfully hit image cache imc-a-b, ...".into(), None),
            ("Successfully hit image cache sg-123".into(), None),
            ("Successfully hit image cache imc-ABC".into(), None),
            (
                format!("Successfully hit image cache imc-{}", "a".repeat(65)),
                None,
            ),
            (image_cache_missed_message(), None),
            (String::new(), None),
        ];
        for (message, id) in cases {
            assert_eq!(hit_image_cache_id(&message), id, "{message:?}");
        }
    }
}

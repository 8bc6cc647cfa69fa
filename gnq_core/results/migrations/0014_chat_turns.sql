-- Schema version 14: a chat text's layout as JSON (sources/chat.py ChatLayout): its turns (role,
-- content's characters in the rendered text, trained), the runs of token positions that carried the
-- loss, and the characters the chat template wrote.  NULL: a plain text (every token trained).
ALTER TABLE examples ADD COLUMN turns VARCHAR;

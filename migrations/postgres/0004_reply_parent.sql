-- The Discord message an observation replies to (message.reference), where Discord says so: retrieval reads a
-- reply with the message it answers. NULL for every memory stored before, and for messages that reply to none.
ALTER TABLE memories ADD COLUMN reply_to text;
